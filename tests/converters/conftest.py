"""Fixtures of the converter tests: ``hub``, a fake Hugging Face Hub on 127.0.0.1 (see ``hubserver.py``)."""

from __future__ import annotations

import pytest

try:  # tests/ folders are not packages: pytest puts this folder on sys.path ("prepend" import mode)
    from hubserver import HubServer
except ImportError:  # pragma: no cover - if tests/ ever becomes a package
    from .hubserver import HubServer


@pytest.fixture
def hub(tmp_path_factory, monkeypatch):
    """A running ``HubServer`` with huggingface_hub pointed at it, an empty HF home and no ambient token.

    huggingface_hub reads ``HF_ENDPOINT``, ``HF_HOME``, ``HF_HUB_CACHE``, ``HF_HUB_OFFLINE`` ... once, when
    ``huggingface_hub.constants`` is imported. So the variables are set (for child processes) *and* the
    already-imported constants are patched (for this process).
    """
    from huggingface_hub import constants
    from huggingface_hub.utils import close_session

    home = tmp_path_factory.mktemp("hf_home")
    server = HubServer().start()
    env = {
        "HF_ENDPOINT": server.endpoint,
        "HF_HOME": str(home),
        "HF_HUB_CACHE": str(home / "hub"),
        "HF_XET_CACHE": str(home / "xet"),
        "HF_TOKEN_PATH": str(home / "token"),
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_OFFLINE": "0",
        "HF_HUB_DISABLE_XET": "1",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    for key in (
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "HF_OIDC_RESOURCE",
        "TRANSFORMERS_OFFLINE",
        "HF_ASSETS_CACHE",
    ):
        monkeypatch.delenv(key, raising=False)
    patched = {
        "ENDPOINT": server.endpoint,
        "HUGGINGFACE_CO_URL_TEMPLATE": server.endpoint + "/{repo_id}/resolve/{revision}/{filename}",
        "HF_HOME": str(home),
        "HF_HUB_CACHE": str(home / "hub"),
        "HF_XET_CACHE": str(home / "xet"),
        "HF_TOKEN_PATH": str(home / "token"),
        "HF_STORED_TOKENS_PATH": str(home / "stored_tokens"),
        "AGENT_HARNESSES_PATH": str(home / ".agent_harnesses.json"),
        "HF_HUB_OFFLINE": False,
        "HF_HUB_DISABLE_TELEMETRY": True,
        "HF_HUB_DISABLE_XET": True,
    }
    for key, value in patched.items():
        monkeypatch.setattr(constants, key, value)
    close_session()  # no pooled connection to an earlier test's server
    try:
        yield server
    finally:
        close_session()
        server.stop()
