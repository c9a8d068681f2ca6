"""sleepy: OUTPUT0 is INPUT0 (FP32, dims [-1]) after sleeping ``sleep_ms`` milliseconds per request.

``sleep_ms`` is a parameter of the model config (config.pbtxt), so one model file serves a fast and
a slow Triton: benchmarks/least_queue.py generates two repositories that differ only in that value.
Sleeping uses no CPU, so on a small machine the two servers differ in speed, not in the CPU they take.
"""

import json
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        parameter = config.get("parameters", {}).get("sleep_ms", {}).get("string_value", "0")
        self.sleep_s = max(0.0, float(parameter)) / 1000.0

    def execute(self, requests):
        responses = []
        for request in requests:
            if self.sleep_s:
                time.sleep(self.sleep_s)
            tensor = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            out = pb_utils.Tensor("OUTPUT0", tensor.as_numpy())
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
