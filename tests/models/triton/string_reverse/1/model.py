"""string_reverse: each element of INPUT0 (BYTES, dims [-1]) with its bytes reversed."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            reversed_ = np.empty(values.shape, dtype=np.object_)
            for i, value in enumerate(values.flat):
                reversed_.flat[i] = bytes(value)[::-1]
            responses.append(
                pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", reversed_)])
            )
        return responses
