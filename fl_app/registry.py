"""Method registry: names used in YAML (``client.name``, ``server.name``) → classes.

Entries are import paths so that importing the registry stays cheap; a class is imported when
a run asks for it. Adding a method = one client module and/or one strategy module + a line here
+ ``conf/methods/<name>.yaml``.

A run's server is composed of two independent parts: the aggregator that ``server.name``
names (``SERVERS``) and the payload exchange that the client brings (its class attribute
``exchange``, a key of ``EXCHANGES``; ``None``: model updates only). So any client works with
any aggregator. The server names of the former client × server combination classes stay
accepted: ``SERVER_ALIASES`` maps each to its aggregator and the exchange it requires.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

from core.params import ConfigError

CLIENTS: dict[str, str] = {
    "fedavg": "clients.base:BaseClient",
    "fedprox": "clients.fedprox:FedProxClient",
    "moon": "clients.moon:MoonClient",
    "fedrcl": "clients.fedrcl:FedRCLClient",
    "fedrane": "clients.fedrane:FedRANEClient",
    "fedccl": "clients.fedccl:FedCCLClient",
    "pmfl": "clients.pmfl:PMFLClient",
}

#: Aggregators: how the server turns the clients' models into the next global model.
SERVERS: dict[str, str] = {
    "fedavg": "strategies.fedavg:FedAvgStrategy",
    "fedavgm": "strategies.fedavg:FedAvgMStrategy",
    "fedadam": "strategies.fedavg:FedAdamStrategy",
    "gne": "strategies.gne:GNEStrategy",
    "fedau": "strategies.fedau:FedAUStrategy",
    "pmfl": "strategies.fedau:PMFLStrategy",
}

#: Payload exchanges a client may bring (``BaseClient.exchange``): what it sends besides its
#: model, and what the server keeps of it and sends back.
EXCHANGES: dict[str, str] = {
    "signals": "strategies.fedccl:SignalExchange",
}

#: Former server names of FedCCL's combination classes: (aggregator, required exchange).
#: ``server.name: fedcclm`` is ``server.name: fedavgm`` with a client that brings signals.
SERVER_ALIASES: dict[str, tuple[str, str]] = {
    "fedccl": ("fedavg", "signals"),
    "fedcclm": ("fedavgm", "signals"),
    "fedccladam": ("fedadam", "signals"),
    "fedcclgne": ("gne", "signals"),
    "fedcclau": ("fedau", "signals"),
}

_TABLES = {"client": CLIENTS, "server": SERVERS}


def _load(path: str) -> Any:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def aggregator_name(server: str) -> str:
    """The aggregator ``server`` names: itself, or the one an alias stands for."""
    return SERVER_ALIASES[server][0] if server in SERVER_ALIASES else server


def resolve(section: str, name: str) -> Any:
    """The class registered as ``name`` for ``section`` ('client' or 'server'; a server
    alias gives its aggregator's class). ConfigError for an unknown name (listing the
    registered ones) or a class that cannot be imported."""
    table = _TABLES[section]
    if section == "server":
        name = aggregator_name(name)
    if name not in table:
        raise ConfigError(
            f"unknown {section}.name {name!r}; choose one of {', '.join(sorted(table))}"
        )
    return _import(section, name, table[name])


def _import(what: str, name: str, path: str) -> Any:
    """The class at ``path`` (``module:Class``); ConfigError naming ``what`` ``name`` when
    it cannot be imported."""
    try:
        return _load(path)
    except (ImportError, AttributeError) as err:
        raise ConfigError(
            f"{what} {name!r} is registered as {path} but cannot be loaded: {err}"
        ) from err


def exchange_name(client: str) -> str | None:
    """The payload exchange the client ``client`` brings (``None``: none)."""
    name: str | None = resolve("client", client).exchange
    return name


def exchange_class(name: str | None) -> Any:
    """The :class:`strategies.exchange.PayloadExchange` subclass registered as ``name``
    (``None`` for ``None``)."""
    return None if name is None else _import("exchange", name, EXCHANGES[name])


def exchange_for(cfg: dict[str, Any]) -> Any:
    """The payload exchange class of a validated config's client (``None``: it brings
    none); the ServerApp builds it and hands it to the aggregator."""
    return exchange_class(exchange_name(cfg["client"]["name"]))


def params_class(section: str, name: str) -> type:
    """The ``Params`` dataclass holding the hyperparameters of a client or of an aggregator
    (a server alias: its aggregator's)."""
    return resolve(section, name).Params


def server_fields(server: str, client: str) -> list[dataclasses.Field[Any]]:
    """The hyperparameters of the ``server`` section with ``client``: the aggregator's
    ``Params`` fields, then those of the exchange the client brings. ConfigError when both
    declare a key (it would be ambiguous which one it sets)."""
    fields = list(dataclasses.fields(params_class("server", server)))
    exchange = exchange_class(exchange_name(client))
    if exchange is not None:
        own = {f.name for f in fields}
        extra = list(dataclasses.fields(exchange.Params))
        if clash := sorted(own & {f.name for f in extra}):
            raise ConfigError(
                f"server.name={server!r} and the {exchange.name} exchange of "
                f"client.name={client!r} both declare server.{', server.'.join(clash)}"
            )
        fields += extra
    return fields


def names_with_param(section: str, key: str) -> list[str]:
    """The registered ``section`` names whose ``Params`` declare ``key`` (for the error on a
    hyperparameter given to a class that does not have it); for the server, the aggregators
    and the aliases of those that declare it."""
    names = sorted({**_TABLES[section], **(SERVER_ALIASES if section == "server" else {})})
    return [
        name
        for name in names
        if key in {f.name for f in dataclasses.fields(params_class(section, name))}
    ]


def clients_with_exchange_param(key: str) -> dict[str, list[str]]:
    """For each exchange whose ``Params`` declare ``key``: the clients that bring it (for
    the error on an exchange hyperparameter given with a client that brings none)."""
    out: dict[str, list[str]] = {}
    for name in sorted(EXCHANGES):
        if key in {f.name for f in dataclasses.fields(exchange_class(name).Params)}:
            out[name] = [c for c in sorted(CLIENTS) if exchange_name(c) == name]
    return out


def check_pairing(client: str, server: str) -> None:
    """Raise ``ConfigError`` when ``server`` is an alias (``SERVER_ALIASES``: FedCCL's former
    combination servers) whose exchange the client does not bring; the message lists the
    servers that would fit (every aggregator takes any client: an exchange is the
    client's)."""
    resolve("server", server)  # an unknown name: its own error
    sent = exchange_name(client)
    needed = SERVER_ALIASES[server][1] if server in SERVER_ALIASES else sent
    if needed == sent:
        return
    fits = [*SERVERS, *(a for a, (_, e) in SERVER_ALIASES.items() if e == sent)]
    what = f"sends {sent}" if sent else "sends no payload"
    raise ConfigError(
        f"client.name={client!r} {what}, which server.name={server!r} cannot take; "
        f"choose server.name from: {', '.join(fits)}"
    )
