"""Each package's ``__all__`` matches what it exports (after anyio's test_all_attributes)."""

from __future__ import annotations

import importlib

import pytest

PACKAGES = ("engine", "triggers", "shared_stream", "producers")


@pytest.mark.parametrize("package_name", PACKAGES)
def test_all_is_a_tuple_of_unique_names(package_name: str) -> None:
    package = importlib.import_module(package_name)
    names = package.__all__
    assert isinstance(names, tuple)
    assert all(isinstance(name, str) for name in names)
    duplicates = sorted({name for name in names if names.count(name) > 1})
    assert not duplicates, f"{package_name}.__all__ lists {duplicates} more than once"


@pytest.mark.parametrize("package_name", PACKAGES)
def test_every_name_in_all_exists(package_name: str) -> None:
    package = importlib.import_module(package_name)
    missing = [name for name in package.__all__ if not hasattr(package, name)]
    assert not missing, f"{package_name}.__all__ names {missing} but the package lacks them"
