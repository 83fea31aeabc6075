"""The ``real_model`` group: goald against a real ``llama-server`` serving SmolLM2-135M-Instruct.

Every test here carries the ``real_model`` marker, which the default run leaves out (``addopts``
in pyproject.toml: ``-m 'not soak and not real_model'``), and skips with the reason when the binary
or the model is not in the cache. Nothing is built by a test; build once with::

    scripts/build_llama_server.sh
    .venv/bin/python -m pytest -q -m real_model tests/real_model

One ``llama-server`` serves the whole group (``-c 2048 -np 1 --jinja``); each test puts its own
:class:`~realkit.RecordingProxy` in front of it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from realkit import TOOL_TEMPLATE, LlamaServer, artifacts, tool_template


@pytest.fixture(scope="session")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    """The real server, started once for the group (skips when it is not built)."""
    found = artifacts()
    if isinstance(found, str):
        pytest.skip(found)
    binary, gguf = found
    log = tmp_path_factory.mktemp("llama") / "llama-server.log"
    server = LlamaServer(binary, gguf, log=log)
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def llama_tools(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    """The real server with a chat template that puts the tools in the prompt and reads tool calls
    (SmolLM2's own template leaves ``tools`` out): :data:`realkit.TOOL_TEMPLATE`."""
    found = artifacts()
    if isinstance(found, str):
        pytest.skip(found)
    template = tool_template()
    if template is None:
        pytest.skip(f"no {TOOL_TEMPLATE} in the llama.cpp sources of the cache: run scripts/build_llama_server.sh")
    binary, gguf = found
    log = tmp_path_factory.mktemp("llama-tools") / "llama-server.log"
    server = LlamaServer(binary, gguf, log=log, extra=["--chat-template-file", str(template)])
    server.start()
    yield server
    server.stop()
