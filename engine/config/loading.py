"""Loading the configuration: typed defaults < ``$SLUICE_HOME/sluice.toml`` <
``SLUICE__<SECTION>__<KEY>``.

One generic path parses every key, driven by the section dataclasses' fields and type
hints (``engine.config.sections``): an environment string is parsed first, then both
sources take the same typed, checked path. Only this module reads the environment:
components take explicit arguments built from a ``Config``.
"""

from __future__ import annotations

import difflib
import logging
import os
import tomllib
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from engine.config.effective import DEFAULT_SOURCE, REDACTORS, Config
from engine.config.sections import SCHEMA, SECTIONS, split_items
from engine.exceptions import ConfigError

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    _Key = tuple[str, str]  # (section, key)

logger = logging.getLogger(__name__)

ENV_PREFIX: Final = "SLUICE__"
HOME_ENV_VAR: Final = "SLUICE_HOME"
CONFIG_ENV_VAR: Final = "SLUICE_CONFIG"
CONFIG_FILE_NAME: Final = "sluice.toml"
DEFAULT_HOME: Final = "~/.sluice"


@dataclass(frozen=True, slots=True)
class _Setting:
    value: object  # a TOML value, or the env var's string
    source: str  # the file path, or "env <VAR>"
    base_dir: Path  # what a relative path is resolved against
    from_env: bool


def _check_known(section: str, key: str | None, source: str) -> None:
    if section not in SCHEMA:
        known = ", ".join(SCHEMA)
        raise ConfigError(f"Unknown config section [{section}] (from {source}); known: {known}")
    if key is not None and key not in SCHEMA[section]:
        close = difflib.get_close_matches(key, SCHEMA[section], n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"known: {', '.join(SCHEMA[section])}"
        raise ConfigError(f"Unknown config key {section}.{key} (from {source}); {hint}")


def _read_file(path: Path) -> dict[_Key, _Setting]:
    try:
        with path.open("rb") as handle:
            document = tomllib.load(handle)
    except FileNotFoundError:
        return {}
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:  # names the line and column
        raise ConfigError(f"Config file {path} is not valid TOML: {exc}") from exc
    except OSError as exc:
        raise ConfigError(f"Config file {path} cannot be read: {exc.strerror}") from exc
    settings = {}
    for section, table in document.items():
        _check_known(section, None, str(path))
        if not isinstance(table, dict):
            raise ConfigError(f"Config file {path}: {section!r} must be a [{section}] table")
        for key, value in table.items():
            _check_known(section, key, str(path))
            settings[(section, key)] = _Setting(value, str(path), path.parent, from_env=False)
    return settings


def _read_env(environ: Mapping[str, str], cwd: Path) -> dict[_Key, _Setting]:
    settings: dict[_Key, _Setting] = {}
    for name in sorted(environ):
        if name[: len(ENV_PREFIX)].upper() != ENV_PREFIX:
            continue
        parts, source = name[len(ENV_PREFIX) :].lower().split("__"), f"env {name}"
        if len(parts) != 2 or not all(parts):
            raise ConfigError(f"Environment variable {name} is not SLUICE__<SECTION>__<KEY>")
        section, key = parts
        _check_known(section, key, source)
        if (section, key) in settings:
            other = settings[(section, key)].source
            raise ConfigError(f"Config key {section}.{key} set by {source} and {other}: unset one")
        settings[(section, key)] = _Setting(environ[name], source, cwd, from_env=True)
    return settings


# Coercion: an env string is parsed first, then both sources take the same typed path.
_ENV_TRUE: Final = ("true", "1", "yes", "on")
_ENV_BOOLS: Final = {word: word in _ENV_TRUE for word in (*_ENV_TRUE, "false", "0", "no", "off")}


def _absolute(path: Path, base_dir: Path) -> Path:
    path = path.expanduser()
    return path if path.is_absolute() else base_dir / path


# base type -> (TOML value types accepted, parser of an env string, what is expected)
_KINDS: Final[dict[Any, tuple[Any, Callable[[str], Any], str]]] = {
    int: ((int,), int, "an integer"),
    float: ((int, float), float, "a number"),
    bool: ((bool,), lambda raw: _ENV_BOOLS[raw.strip().lower()], "true or false"),
    str: ((str,), str, "a string"),
    Path: ((str,), str, "a path"),
    tuple: ((list,), lambda raw: raw.split(","), "a list of strings (env: comma-separated)"),
}


def _typed(base: Any, setting: _Setting) -> Any:
    accepted, parse, _ = _KINDS[base]
    value: Any = parse(str(setting.value)) if setting.from_env else setting.value
    if not isinstance(value, accepted) or (isinstance(value, bool) and base is not bool):
        raise TypeError(f"{type(value).__name__} is not {base}")
    if base is Path and not value.strip():
        raise ValueError("empty path")
    if base is Path:
        return _absolute(Path(value), setting.base_dir)
    return split_items(value) if base is tuple else float(value) if base is float else value


def _convert(section: str, key: str, setting: _Setting) -> Any:
    """The typed, checked value of one setting (a str from env, a TOML value from the file)."""
    fld, hint = SCHEMA[section][key]
    optional = type(None) in typing.get_args(hint)  # `X | None`: the only unions used
    base = next(a for a in typing.get_args(hint) if a is not type(None)) if optional else hint
    raw, from_env = setting.value, setting.from_env
    if optional and from_env and str(raw).strip().lower() in {"", "none"}:
        return None
    got = "" if (section, key) in REDACTORS else f", got {type(raw).__name__} {raw!r}"
    where = f"Config key {section}.{key} (from {setting.source})"
    try:
        value = _typed(typing.get_origin(base) or base, setting)
    except (TypeError, ValueError, KeyError) as exc:
        expected = _KINDS[typing.get_origin(base) or base][2]
        problem = f"must be {expected}{' or none' if optional and from_env else ''}{got}"
        raise ConfigError(f"{where} {problem}") from exc
    try:
        return value if fld.metadata["check"] is None else fld.metadata["check"](value)
    except ValueError as exc:
        raise ConfigError(f"{where} {exc}{got}") from exc


def _build_section(
    name: str, settings: Mapping[_Key, _Setting], home: Path, sources: dict[_Key, str]
) -> Any:
    """The section's dataclass; records each key's source in ``sources``."""
    values: dict[str, Any] = {}
    for key, (fld, _) in SCHEMA[name].items():
        setting = settings.get((name, key))
        if setting is None:
            derive = fld.metadata["derive"]
            values[key] = derive(home, values) if derive else fld.default
        else:
            values[key] = _convert(name, key, setting)
        sources[(name, key)] = DEFAULT_SOURCE if setting is None else setting.source
    return SECTIONS[name](**values)


def sluice_home(environ: Mapping[str, str] | None = None) -> Path:
    """``$SLUICE_HOME`` (relative to the cwd if relative), else ``~/.sluice``."""
    env = os.environ if environ is None else environ
    return _absolute(Path(env.get(HOME_ENV_VAR, "").strip() or DEFAULT_HOME), Path.cwd())


def load_config(
    *,
    environ: Mapping[str, str] | None = None,
    home: Path | None = None,
    config_file: Path | None = None,
) -> Config:
    """Defaults < the file (``config_file``, else ``$SLUICE_CONFIG``, else
    ``<home>/sluice.toml``, which may be missing) < env. ``ConfigError`` names the key and
    source. A file named explicitly (argument or ``$SLUICE_CONFIG``) must exist: a typo there
    must not silently run on defaults."""
    env = os.environ if environ is None else environ
    cwd = Path.cwd()
    home_dir = _absolute(home, cwd) if home is not None else sluice_home(env)
    home_source = _home_source(home, env)
    named_by = "the config_file argument" if config_file is not None else None
    if config_file is None and env.get(CONFIG_ENV_VAR, "").strip():
        named_by = CONFIG_ENV_VAR
    if config_file is None:
        from_env = env.get(CONFIG_ENV_VAR, "").strip()
        config_file = Path(from_env) if from_env else home_dir / CONFIG_FILE_NAME
    config_file = _absolute(config_file, cwd)
    if named_by is not None and not config_file.is_file():
        raise ConfigError(
            f"config file {config_file} (named by {named_by}) does not exist; fix the path or "
            f"unset {CONFIG_ENV_VAR} to use {home_dir / CONFIG_FILE_NAME}"
        )
    settings = {**_read_file(config_file), **_read_env(env, cwd)}
    sources: dict[_Key, str] = {}
    sections = {name: _build_section(name, settings, home_dir, sources) for name in SCHEMA}
    logger.debug("Config loaded from %s", config_file, extra={"action": "config_loaded"})
    proxy = types.MappingProxyType(sources)
    return Config(
        home=home_dir, config_file=config_file, sources=proxy, home_source=home_source, **sections
    )


def _home_source(home: Path | None, environ: Mapping[str, str]) -> str:
    """Where the home came from, as ``Config.sources`` names a key's source."""
    if home is not None:
        return "the home argument"
    if environ.get(HOME_ENV_VAR, "").strip():
        return f"env {HOME_ENV_VAR}"
    return f"the {DEFAULT_SOURCE}: {HOME_ENV_VAR} is unset"
