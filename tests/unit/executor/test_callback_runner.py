"""The protocol of the callback child process (``engine.executor.callback_runner``)."""

from __future__ import annotations

import pytest

from engine.executor.callback_runner import CallbackSpec


def test_callback_specs_refuse_what_they_cannot_run() -> None:
    spec = CallbackSpec(kind="dag", callback="on_success_callback", spec="{}", reason="success")
    assert CallbackSpec.from_json(spec.to_json()) == spec
    with pytest.raises(ValueError, match="malformed callback spec"):
        CallbackSpec.from_json('{"kind": "dag", "callback": "on_retry_callback", "spec": "{}"}')
    with pytest.raises(ValueError, match="malformed callback spec"):
        CallbackSpec.from_json("not json")
