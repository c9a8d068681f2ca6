"""identity_<DT>: OUTPUT0 is INPUT0 (same datatype, same shape, including 0-sized dims).

The same file serves every identity_* model (each identity_*/1/model.py is a symlink to it).
BF16 has no numpy dtype, so that tensor is passed through DLPack instead of numpy.
"""

import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.use_dlpack = config["input"][0]["data_type"] == "TYPE_BF16"

    def execute(self, requests):
        responses = []
        for request in requests:
            tensor = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            if self.use_dlpack:
                out = pb_utils.Tensor.from_dlpack("OUTPUT0", tensor.to_dlpack())
            else:
                out = pb_utils.Tensor("OUTPUT0", tensor.as_numpy())
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
