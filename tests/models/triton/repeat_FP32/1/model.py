"""repeat_FP32 (decoupled): one response per element of IN, each OUT = [element], then the
final flag — the shape of Triton's "repeat" example, for ModelStreamInfer through the gateway."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            for v in values.reshape(-1):
                out = pb_utils.Tensor("OUT", np.array([v], dtype=np.float32))
                sender.send(pb_utils.InferenceResponse(output_tensors=[out]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
