"""add_sub (tests/models/triton/add_sub) that takes ``load_delay_s`` seconds to load.

tests/support/fleet.py symlinks this file as ``<model>/1/model.py`` of a generated repository whose
config.pbtxt is add_sub's with another name and a ``load_delay_s`` parameter. The inference logic is
add_sub's own module, imported from its file; only ``initialize`` is added here.
"""

import importlib.util
import json
import time
from pathlib import Path

# resolve(): this file is reached through a symlink in the generated repository.
_ADD_SUB = Path(__file__).resolve().parent.parent / "triton" / "add_sub" / "1" / "model.py"


def _load_add_sub():
    spec = importlib.util.spec_from_file_location("oip_test_add_sub_model", _ADD_SUB)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_add_sub = _load_add_sub()


class TritonPythonModel(_add_sub.TritonPythonModel):
    def initialize(self, args):
        config = json.loads(args["model_config"])
        delay = float(config["parameters"]["load_delay_s"]["string_value"])
        # A deliberately slow load: Triton's ports are open and the server is live meanwhile, while
        # requests for this model are refused as unknown / not ready.
        time.sleep(delay)
        parent_initialize = getattr(super(), "initialize", None)
        if parent_initialize is not None:
            parent_initialize(args)
