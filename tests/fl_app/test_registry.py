import pytest

from core.params import ConfigError
from fl_app import registry


@pytest.mark.parametrize("section", ["client", "server"])
def test_every_registered_name_resolves_to_its_class(section):
    table = {"client": registry.CLIENTS, "server": registry.SERVERS}[section]
    for name, path in table.items():
        cls = registry.resolve(section, name)
        module, _, attr = path.partition(":")
        assert isinstance(cls, type) and cls.__module__ == module and cls.__name__ == attr


def test_unknown_name_lists_the_registered_ones():
    with pytest.raises(ConfigError) as err:
        registry.resolve("client", "fedsgd")
    assert str(err.value) == (
        "unknown client.name 'fedsgd'; choose one of " + ", ".join(sorted(registry.CLIENTS))
    )
    with pytest.raises(ConfigError, match=r"unknown server.name 'moon'; choose one of fedadam, "):
        registry.resolve("server", "moon")  # a client name is not a server name


@pytest.mark.parametrize(
    ("path", "cause"),
    [
        ("clients.no_such_module:Client", ModuleNotFoundError),
        ("clients.base:NoSuchClient", AttributeError),
    ],
)
def test_registered_but_unloadable_is_a_config_error(monkeypatch, path, cause):
    monkeypatch.setitem(registry.CLIENTS, "broken", path)
    with pytest.raises(ConfigError) as err:
        registry.resolve("client", "broken")
    msg = str(err.value)
    assert msg.startswith(f"client 'broken' is registered as {path} but cannot be loaded: ")
    assert str(err.value.__cause__) in msg and isinstance(err.value.__cause__, cause)
    reason = msg.split("cannot be loaded: ", 1)[1]  # the path itself names the culprit too
    assert ("no_such_module" if cause is ModuleNotFoundError else "NoSuchClient") in reason


def test_a_module_that_fails_on_import_is_a_config_error(monkeypatch, tmp_path):
    (tmp_path / "fl_test_broken_strategy.py").write_text(
        "import no_such_dependency_xyz\nclass Strategy: ...\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(registry.SERVERS, "broken", "fl_test_broken_strategy:Strategy")
    with pytest.raises(ConfigError, match=r"server 'broken' is registered as .*no_such_dep"):
        registry.resolve("server", "broken")


def test_every_exchange_a_client_brings_is_registered_and_loads():
    from strategies.exchange import PayloadExchange

    brought = {registry.exchange_name(c) for c in registry.CLIENTS} - {None}
    assert brought == set(registry.EXCHANGES) == {"signals"}
    for name in registry.EXCHANGES:
        cls = registry.exchange_class(name)
        assert issubclass(cls, PayloadExchange) and cls.name == name
    assert registry.exchange_class(None) is None


def test_former_fedccl_server_names_are_aliases_of_an_aggregator_with_the_signals():
    """The combination classes are gone: each former name gives its aggregator's class, and
    FedCCL's client brings the signals to any aggregator."""
    for alias, (aggregator, exchange) in registry.SERVER_ALIASES.items():
        assert alias not in registry.SERVERS and exchange in registry.EXCHANGES
        assert registry.resolve("server", alias) is registry.resolve("server", aggregator)
        registry.check_pairing("fedccl", alias)
        with pytest.raises(ConfigError, match=f"server.name={alias!r} cannot take"):
            registry.check_pairing("fedrcl", alias)
    for aggregator in registry.SERVERS:
        for client in registry.CLIENTS:
            registry.check_pairing(client, aggregator)  # any client, any aggregator
