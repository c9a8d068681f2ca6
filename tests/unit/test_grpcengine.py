"""grpc's socket engine is chosen before grpc loads when asked for (OIP_GATEWAY_GRPC_EVENT_ENGINE=0),
and an explicit GRPC_EXPERIMENTS wins (gateway/grpcengine.py; its effect on CPU per call is the load
benchmark's to show)."""
from __future__ import annotations

import os
import subprocess
import sys

from gateway.grpcengine import ENGINE_CHOSEN, ENGINE_OFF, choose_grpc_engine, grpc_engine, unchosen

# What a process sees once it has imported the gateway and then grpc, as the gateway's own
# modules do: the variable grpc's core reads when it starts.
CODE = "import gateway, grpc, os; print(os.environ.get('GRPC_EXPERIMENTS', '<unset>'))"


def run(env_extra: dict[str, str], code: str = CODE) -> str:
    env = {k: v for k, v in unchosen(dict(os.environ)).items() if k != "OIP_GATEWAY_GRPC_EVENT_ENGINE"}
    env.update(env_extra)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True).stdout.strip()


def test_grpc_default_unless_asked():
    env: dict[str, str] = {}
    assert choose_grpc_engine(env, loaded=False) is False
    assert env == {}
    assert "default" in grpc_engine(env)
    env = {"OIP_GATEWAY_GRPC_EVENT_ENGINE": "1"}
    assert choose_grpc_engine(env, loaded=False) is False
    assert "GRPC_EXPERIMENTS" not in env


def test_set_when_asked():
    env: dict[str, str] = {"OIP_GATEWAY_GRPC_EVENT_ENGINE": "0"}
    assert choose_grpc_engine(env, loaded=False) is True
    assert env == {"OIP_GATEWAY_GRPC_EVENT_ENGINE": "0", "GRPC_EXPERIMENTS": ENGINE_OFF, ENGINE_CHOSEN: "1"}
    assert "EventEngine off" in grpc_engine(env)
    # A process started from this one inherits the choice as made (not as the user's)...
    assert choose_grpc_engine(dict(env), loaded=False) is False
    # ... and a harness comparing trees can take it back, so each tree chooses for itself.
    assert unchosen(dict(env, PATH="/bin")) == {"OIP_GATEWAY_GRPC_EVENT_ENGINE": "0", "PATH": "/bin"}
    assert unchosen({"GRPC_EXPERIMENTS": "x", "PATH": "/bin"}) == {"GRPC_EXPERIMENTS": "x", "PATH": "/bin"}


def test_explicit_setting_wins():
    env = {"GRPC_EXPERIMENTS": "event_engine_client", "OIP_GATEWAY_GRPC_EVENT_ENGINE": "0"}
    assert choose_grpc_engine(env, loaded=False) is False
    assert env["GRPC_EXPERIMENTS"] == "event_engine_client"
    assert "GRPC_EXPERIMENTS=event_engine_client" in grpc_engine(env)


def test_not_set_once_grpc_is_loaded():
    # grpc read its configuration when it was imported: a later setting would be a lie.
    env: dict[str, str] = {"OIP_GATEWAY_GRPC_EVENT_ENGINE": "0"}
    assert choose_grpc_engine(env, loaded=True) is False
    assert "GRPC_EXPERIMENTS" not in env


def test_importing_the_gateway_sets_it_before_grpc_loads():
    off = {"OIP_GATEWAY_GRPC_EVENT_ENGINE": "0"}
    assert run(off) == ENGINE_OFF
    assert run(dict(off, GRPC_EXPERIMENTS="-event_engine_listener")) == "-event_engine_listener"
    assert run({}) == "<unset>"
    # grpc first, the gateway after: nothing is set (grpc would not read it).
    assert run(off, "import grpc, gateway, os; print(os.environ.get('GRPC_EXPERIMENTS', '<unset>'))") == "<unset>"


def test_grpc_accepts_the_setting_silently():
    # A name grpc does not know is logged as an error at its start ("Unknown experiment"):
    # the two the gateway turns off must be known to the installed grpcio.
    code = ("import gateway, asyncio\nfrom grpc import aio\n"
            "async def main():\n"
            "    server = aio.server(); server.add_insecure_port('127.0.0.1:0'); await server.start()\n"
            "    await server.stop(None)\n"
            "asyncio.run(main())\n")
    env = {k: v for k, v in unchosen(dict(os.environ)).items() if k != "OIP_GATEWAY_GRPC_EVENT_ENGINE"}
    env["OIP_GATEWAY_GRPC_EVENT_ENGINE"] = "0"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert "experiment" not in (out.stdout + out.stderr).lower(), out.stderr
    bogus = subprocess.run([sys.executable, "-c", code], env=dict(env, GRPC_EXPERIMENTS="-no_such_experiment_x"),
                           capture_output=True, text=True, check=True)
    assert "no_such_experiment_x" in bogus.stderr  # (the check above can see grpc's complaint)


def test_read_ahead_is_capped_on_both_sides():
    # grpc's read buffer per connection has no upper bound of its own (grpcengine.py): the listener's
    # connections from clients and the backend channels' connections both carry the cap.
    from gateway.backends.grpc_endpoint import channel_options
    from gateway.frontend.grpc import server_options
    from gateway.grpcengine import READ_BUFFER_CAP, READ_BUFFER_OPTION

    assert READ_BUFFER_OPTION == ("grpc.experimental.tcp_max_read_buffer_size", READ_BUFFER_CAP)
    assert READ_BUFFER_OPTION in server_options(64 << 20)
    assert READ_BUFFER_OPTION in channel_options(64 << 20)
