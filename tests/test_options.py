"""Every option is declared once; an undeclared or refused one is refused at start, by name."""

from __future__ import annotations

import pytest

from regional.errors import RegionalConfigError
from regional.inputs import generator
from regional.options import SPARK_READ, Option, OptionTable, check_given, declared_by, markdown
from regional.protocol.settings import SETTINGS_OPTIONS
from regional.spark.reader import READ_OPTIONS
from regional.targets.delta import DeltaTarget

TABLES = [generator.OPTIONS, READ_OPTIONS, SETTINGS_OPTIONS, SPARK_READ]


def test_declared_options_pass_whatever_their_case() -> None:
    check_given("readStream", {"source": "generator", "rowsperepoch": "5", "regionattempts": "2",
                               "checkpointlocation": "/c", "path": "/p"}, TABLES)


def test_a_typo_is_refused_by_name_with_the_nearest_option() -> None:
    with pytest.raises(RegionalConfigError, match=r"'rowsPerEpohc'.*Did you mean 'rowsPerEpoch'"):
        check_given("readStream", {"source": "generator", "rowsPerEpohc": "5"}, TABLES)


def test_an_unknown_option_is_refused_even_without_a_near_name() -> None:
    with pytest.raises(RegionalConfigError, match=r"readStream option 'frobnicate' is not an option"):
        check_given("readStream", {"frobnicate": "1"}, TABLES)


def test_a_refused_stock_option_says_why() -> None:
    table = OptionTable("t", [Option("cleanSource", "off", "m", refused="use X instead", stock=True),
                              Option("kafka.", "", "consumer settings", prefix=True)])
    with pytest.raises(RegionalConfigError, match="'cleanSource' is not supported by regional: use X instead"):
        check_given("readStream", {"cleansource": "delete"}, [table])
    check_given("readStream", {"kafka.bootstrap.servers": "h:1"}, [table])  # a prefix option


def test_declarations_are_found_on_the_instance_module_and_rendered() -> None:
    assert declared_by(generator.GeneratorInput({})) is generator.OPTIONS
    assert declared_by(object()) is None
    text = markdown(generator.OPTIONS)
    assert "| `rowsPerEpoch` | `100` |" in text


def test_every_built_in_source_and_target_declares_its_options() -> None:
    # A class that declared none would skip the check at start: every option given to it would pass unread.
    import importlib
    import inspect
    import pkgutil

    import regional.inputs
    import regional.targets
    from regional.inputs.base import RegionInput
    from regional.targets.base import Target

    classes = []
    for package, base in ((regional.inputs, RegionInput), (regional.targets, Target)):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            module = importlib.import_module(info.name)
            classes += [c for _, c in inspect.getmembers(module, inspect.isclass)
                        if issubclass(c, base) and not inspect.isabstract(c) and c.__module__ == info.name]
    names = {c.__name__ for c in classes}
    assert {"GeneratorInput", "KafkaInput", "DeltaTarget", "PostgresTarget"} <= names, names
    wrappers = ("DuckTarget", "DeadLetterTopic", "RegionalTarget")  # a user's class; the sink's own dead letters
    undeclared = [f"{c.__module__}.{c.__name__}" for c in classes
                  if c.__name__ not in wrappers and declared_by(object.__new__(c)) is None]
    assert not undeclared


class _SubclassWithoutOptions(DeltaTarget):
    def __init__(self) -> None:  # never opened: only its class is looked at
        pass


class _SubclassWithOptions(DeltaTarget):
    OPTIONS = OptionTable("python:my.Target", [Option("failRegion", "", "a region this subclass fails")])

    def __init__(self) -> None:
        pass


def test_a_users_subclass_of_a_built_in_target_declares_its_own_options_or_none() -> None:
    # A user's subclass that reads options of its own must not be refused by the base's table (it was, at
    # cd7ac0f: every integration fault target failed at start); one that declares them is checked against both.
    assert declared_by(_SubclassWithoutOptions()) is None
    table = declared_by(_SubclassWithOptions())
    assert table is not None and table.title == "python:my.Target"
    check_given("writeStream", {"failregion": "a", "mergeschema": "true"}, [table])
    with pytest.raises(RegionalConfigError, match=r"'failregoin'.*Did you mean 'failRegion'"):
        check_given("writeStream", {"failregoin": "a"}, [table])
