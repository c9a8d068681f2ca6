"""add_sub: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 (FP32, dims [-1])."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            if a.shape != b.shape:
                error = pb_utils.TritonError(f"INPUT0 shape {list(a.shape)} != INPUT1 shape {list(b.shape)}")
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=error))
                continue
            out0 = pb_utils.Tensor("OUTPUT0", (a + b).astype(np.float32))
            out1 = pb_utils.Tensor("OUTPUT1", (a - b).astype(np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out0, out1]))
        return responses
