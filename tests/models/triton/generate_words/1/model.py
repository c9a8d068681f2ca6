"""generate_words (decoupled): Triton's generate / generate_stream through the gateway.

One response per whitespace-separated word of ``text_input`` (at most ``max_tokens``):
``text_output`` = the word, ``index`` = its position; then the final flag. The word
``FAIL`` becomes an error response in its place (a mid-stream error).

Request parameter ``gate`` (a path) makes the stream controllable by a test without
sleeps: the first word goes out at once, every later one only once the file ``gate``
exists. While waiting, a cancelled request (the client or the gateway hung up) stops
the stream and leaves ``<gate>.cancelled`` behind, so a test can prove cancellation.

Each request runs in its own thread (decoupled models may answer after ``execute``
returns), so a held-back stream does not block other requests to the one instance.
"""

import json
import os
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

_GATE_WAIT_S = 120.0  # a forgotten gate ends the stream with an error instead of hanging


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            words = b" ".join(
                bytes(v) for v in pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().flat
            ).split()
            limit = pb_utils.get_input_tensor_by_name(request, "max_tokens")
            if limit is not None:
                words = words[: int(limit.as_numpy().reshape(-1)[0])]
            params = json.loads(request.parameters() or "{}")
            gate = params.get("gate")
            sender = request.get_response_sender()
            threading.Thread(target=self._answer, args=(sender, words, gate), daemon=True).start()
        return None

    def _answer(self, sender, words, gate):
        try:
            for i, word in enumerate(words):
                if i > 0 and gate:
                    waited = self._wait(sender, gate)
                    if waited is not None:
                        if waited:
                            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(waited)))
                        break
                if word == b"FAIL":
                    sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"word {i} failed")))
                    continue
                out = [pb_utils.Tensor("text_output", np.array([word], dtype=np.object_)),
                       pb_utils.Tensor("index", np.array([i], dtype=np.int32))]
                sender.send(pb_utils.InferenceResponse(output_tensors=out))
        finally:
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    @staticmethod
    def _wait(sender, gate):
        """None once the gate is open; "" when cancelled (marked on disk); else an error text."""
        deadline = time.monotonic() + _GATE_WAIT_S
        while not os.path.exists(gate):
            if sender.is_cancelled():
                with open(gate + ".cancelled", "w"):
                    pass
                return ""
            if time.monotonic() > deadline:
                return f"gate {gate} not opened within {_GATE_WAIT_S}s"
            time.sleep(0.005)  # the model's own poll of its gate, not a test's synchronization
        return None
