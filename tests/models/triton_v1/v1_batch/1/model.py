"""v1_batch: OUTPUT0 = INPUT0 × the model's version, PROB = INPUT0 (FP32, [batch, 4])."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.factor = np.float32(int(args["model_version"]))

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            out = pb_utils.Tensor("OUTPUT0", (x * self.factor).astype(np.float32))
            prob = pb_utils.Tensor("PROB", x.astype(np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out, prob]))
        return responses
