"""v1_sequence: SUM is the running sum of INPUT0 over a sequence (reset by START); the
sequence controls START, END and CORRID are echoed as START_OUT, END_OUT, CORRID_OUT."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            start = pb_utils.get_input_tensor_by_name(request, "START").as_numpy()
            end = pb_utils.get_input_tensor_by_name(request, "END").as_numpy()
            corrid = pb_utils.get_input_tensor_by_name(request, "CORRID").as_numpy()
            key = int(corrid.reshape(-1)[0])
            total = (0 if int(start.reshape(-1)[0]) else self.sums.get(key, 0)) + int(x.reshape(-1)[0])
            self.sums[key] = total
            if int(end.reshape(-1)[0]):
                self.sums.pop(key, None)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("SUM", np.array([[total]], dtype=np.int32)),
                pb_utils.Tensor("START_OUT", start.astype(np.int32).reshape(1, 1)),
                pb_utils.Tensor("END_OUT", end.astype(np.int32).reshape(1, 1)),
                pb_utils.Tensor("CORRID_OUT", corrid.astype(np.uint64).reshape(1, 1)),
            ]))
        return responses
