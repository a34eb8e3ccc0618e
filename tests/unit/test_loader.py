from __future__ import annotations

import importlib
import sys
import textwrap
from typing import TYPE_CHECKING, Any

import pytest

from engine.exceptions import TriggerClassNotAllowedError, TriggerLoadError
from engine.loader import import_trigger_class, instantiate_trigger, is_module_allowed
from triggers.base import BaseTrigger

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

ALLOWED = ("triggers", "producers.kafka")


def build(classpath: str, kwargs: dict[str, object], **where: Any) -> BaseTrigger:
    """What the triggerer does with a row: import the class (allowed modules only), then
    instantiate it."""
    return instantiate_trigger(import_trigger_class(classpath, **where), classpath, kwargs)


ECHO_PLUGIN = """
from triggers.base import BaseTrigger, TriggerEvent


class EchoTrigger(BaseTrigger):
    def __init__(self, message: str):
        super().__init__()
        self.message = message

    def serialize(self):
        return (f"{__name__}.EchoTrigger", {"message": self.message})

    async def run(self):
        yield TriggerEvent(self.message)


class NotATrigger:
    pass
"""


def marker_module(marker: Path) -> str:
    """Source of a module that records its own import in ``marker``."""
    return f"import pathlib\npathlib.Path({str(marker)!r}).write_text('imported')\n"


@pytest.fixture(autouse=True)
def isolated_imports(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """Restore sys.path and drop the modules a test imported from its tmp_path."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield
    for name, module in list(sys.modules.items()):
        if str(getattr(module, "__file__", None) or "").startswith(str(tmp_path)):
            del sys.modules[name]
    importlib.invalidate_caches()


@pytest.fixture
def plugins(tmp_path: Path) -> Path:
    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / "echo_plugin.py").write_text(ECHO_PLUGIN)
    (folder / "pkg_plugin").mkdir()
    (folder / "pkg_plugin" / "__init__.py").write_text("")
    (folder / "pkg_plugin" / "echo.py").write_text(ECHO_PLUGIN)
    (folder / "namespace_dir").mkdir()
    (folder / "namespace_dir" / "mod.py").write_text(ECHO_PLUGIN)
    (folder / "notes.txt").write_text("not a module")
    return folder


@pytest.mark.parametrize(
    ("module", "allowed", "expected"),
    [
        ("triggers", ["triggers"], True),
        ("triggers.file", ["triggers"], True),
        ("triggers.file.deep", ["triggers"], True),
        ("triggers_evil", ["triggers"], False),
        ("triggers_evil.file", ["triggers"], False),
        ("xtriggers", ["triggers"], False),
        ("xtriggers.file", ["triggers"], False),
        ("producers.kafka", ["producers.kafka"], True),
        ("producers.kafka.trigger", ["producers.kafka"], True),
        ("producers.kafka_evil", ["producers.kafka"], False),
        ("producers", ["producers.kafka"], False),
        ("producers.sqs", ["producers.kafka"], False),
        ("triggers.file", ["triggers."], True),
        ("triggers.file", [" triggers "], True),
        ("anything", [], False),
        ("anything", [""], False),
        ("anything", ["."], False),
        ("triggers..file", ["triggers"], False),
        ("triggers.", ["triggers"], False),
        ("", ["triggers"], False),
    ],
)
def test_allowed_prefixes_match_on_dotted_boundaries(
    module: str, allowed: list[str], expected: bool
) -> None:
    assert is_module_allowed(module, allowed, plugins_folder=None) is expected


@pytest.mark.parametrize(
    ("module", "expected"),
    [
        ("echo_plugin", True),
        ("echo_plugin.sub", True),
        ("pkg_plugin", True),
        ("pkg_plugin.echo", True),
        ("echo_plugin_evil", False),
        ("xecho_plugin", False),
        ("namespace_dir.mod", False),
        ("notes", False),
        ("plugins.echo_plugin", False),
    ],
)
def test_plugins_folder_modules_are_allowed_without_importing(
    plugins: Path, module: str, expected: bool
) -> None:
    (plugins / "echo_plugin.py").write_text(marker_module(plugins / "imported.marker"))
    assert is_module_allowed(module, ALLOWED, plugins_folder=plugins) is expected
    assert is_module_allowed(module, ALLOWED, plugins_folder=None) is False
    assert not (plugins / "imported.marker").exists()
    assert "echo_plugin" not in sys.modules


def test_refused_classpath_is_never_imported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code_dir = tmp_path / "elsewhere"
    code_dir.mkdir()
    marker = tmp_path / "imported.marker"
    (code_dir / "evil_module.py").write_text(marker_module(marker))
    monkeypatch.syspath_prepend(str(code_dir))

    with pytest.raises(TriggerClassNotAllowedError) as info:
        import_trigger_class("evil_module.EvilTrigger", allowed=ALLOWED)
    message = str(info.value)
    assert "'evil_module.EvilTrigger'" in message
    assert str(list(ALLOWED)) in message
    assert "[triggerer] allowed_trigger_modules" in message
    assert not marker.exists()
    assert "evil_module" not in sys.modules

    importlib.import_module("evil_module")  # the set-up would have caught an import
    assert marker.exists()


def test_plugin_module_is_imported_and_built(plugins: Path) -> None:
    cls = import_trigger_class("echo_plugin.EchoTrigger", allowed=ALLOWED, plugins_folder=plugins)
    assert issubclass(cls, BaseTrigger)
    assert sys.modules["echo_plugin"].__file__ == str(plugins / "echo_plugin.py")

    trigger = build(
        "pkg_plugin.echo.EchoTrigger",
        {"message": "hi"},
        allowed=ALLOWED,
        plugins_folder=plugins,
    )
    classpath, kwargs = trigger.serialize()
    assert (classpath, kwargs) == ("pkg_plugin.echo.EchoTrigger", {"message": "hi"})
    assert build(classpath, kwargs, allowed=ALLOWED, plugins_folder=plugins) == trigger
    assert sys.path.count(str(plugins)) == 1


def test_same_top_name_outside_the_plugins_folder_is_refused(
    tmp_path: Path, plugins: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code_dir = tmp_path / "elsewhere"
    code_dir.mkdir()
    marker = tmp_path / "imported.marker"
    (code_dir / "outside_plugin.py").write_text(marker_module(marker))
    monkeypatch.syspath_prepend(str(code_dir))

    with pytest.raises(TriggerClassNotAllowedError):
        import_trigger_class("outside_plugin.T", allowed=ALLOWED, plugins_folder=plugins)
    assert not marker.exists()
    assert "outside_plugin" not in sys.modules


def test_plugin_shadowed_by_an_earlier_sys_path_entry_is_refused(
    tmp_path: Path, plugins: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code_dir = tmp_path / "elsewhere"
    code_dir.mkdir()
    marker = tmp_path / "imported.marker"
    (code_dir / "echo_plugin.py").write_text(marker_module(marker))
    monkeypatch.syspath_prepend(str(code_dir))

    with pytest.raises(TriggerClassNotAllowedError, match="instead of the plugins folder"):
        import_trigger_class("echo_plugin.EchoTrigger", allowed=ALLOWED, plugins_folder=plugins)
    assert not marker.exists()
    assert "echo_plugin" not in sys.modules


def test_plugin_named_like_an_imported_module_is_refused(plugins: Path) -> None:
    (plugins / "json.py").write_text(ECHO_PLUGIN)
    with pytest.raises(TriggerClassNotAllowedError, match="'json' resolves to"):
        import_trigger_class("json.EchoTrigger", allowed=ALLOWED, plugins_folder=plugins)


def test_bad_kwargs_name_the_class_and_error_but_not_values(plugins: Path) -> None:
    with pytest.raises(TriggerLoadError) as info:
        build(
            "echo_plugin.EchoTrigger",
            {"message": "x", "password": "s3cret-value"},
            allowed=ALLOWED,
            plugins_folder=plugins,
        )
    message = str(info.value)
    assert "echo_plugin.EchoTrigger" in message
    assert "unexpected keyword argument 'password'" in message
    assert "s3cret-value" not in message
    assert isinstance(info.value.__cause__, TypeError)


@pytest.mark.parametrize(
    ("classpath", "match"),
    [
        ("echo_plugin.NotATrigger", "is not a trigger class"),
        ("echo_plugin.TriggerEvent", "is not a trigger class"),
        ("echo_plugin.Missing", "has no attribute 'Missing'"),
        ("triggers.base.logger", "is not a trigger class"),
        ("triggers.base.BaseTrigger", "is abstract"),
        ("triggers.no_such_module.T", "cannot import trigger module 'triggers.no_such_module'"),
    ],
)
def test_unusable_classes_raise_trigger_load_error(
    plugins: Path, classpath: str, match: str
) -> None:
    with pytest.raises(TriggerLoadError, match=match) as info:
        import_trigger_class(classpath, allowed=ALLOWED, plugins_folder=plugins)
    assert type(info.value) is TriggerLoadError


@pytest.mark.parametrize("classpath", ["NoDot", ".Leading", "trailing.", "a b.C", "mod.1Class"])
def test_malformed_classpath_raises_trigger_load_error(classpath: str) -> None:
    with pytest.raises(TriggerLoadError, match="malformed trigger classpath") as info:
        import_trigger_class(classpath, allowed=["", "NoDot", "a b"])
    assert type(info.value) is TriggerLoadError


@pytest.mark.parametrize(
    ("source", "cause"),
    [
        ("def broken(:\n", SyntaxError),
        ("raise RuntimeError('boom at import')\n", RuntimeError),
        ("import sys\nsys.exit(3)\n", SystemExit),
    ],
)
def test_plugin_failing_at_import_raises_trigger_load_error(
    plugins: Path, source: str, cause: type[BaseException]
) -> None:
    (plugins / "broken_plugin.py").write_text(textwrap.dedent(source))
    with pytest.raises(
        TriggerLoadError, match="cannot import trigger module 'broken_plugin'"
    ) as info:
        import_trigger_class("broken_plugin.T", allowed=ALLOWED, plugins_folder=plugins)
    assert isinstance(info.value.__cause__, cause)
    assert "broken_plugin" not in sys.modules


def test_the_engines_own_trigger_modules_are_allowed_whatever_the_configuration() -> None:
    classpath = "engine.authoring.external_task_trigger.ExternalTaskTrigger"
    assert is_module_allowed(classpath.rpartition(".")[0], [], plugins_folder=None)
    assert import_trigger_class(classpath, allowed=[]).__name__ == "ExternalTaskTrigger"
    assert not is_module_allowed("engine.authoring.dag", [], plugins_folder=None)  # exact names
