"""Method registry: names used in YAML (``client.name``, ``server.name``) → classes.

Entries are import paths so that importing the registry stays cheap; a class is imported when
a run asks for it. Adding a method = one client module and/or one strategy module + a line here
+ ``conf/methods/<name>.yaml``.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

CLIENTS: dict[str, str] = {
    "fedavg": "clients.base:BaseClient",
    "fedprox": "clients.fedprox:FedProxClient",
    "moon": "clients.moon:MoonClient",
    "fedrcl": "clients.fedrcl:FedRCLClient",
    "fedrane": "clients.fedrane:FedRANEClient",
    "fedccl": "clients.fedccl:FedCCLClient",
    "pmfl": "clients.pmfl:PMFLClient",
}

SERVERS: dict[str, str] = {
    "fedavg": "strategies.base:FedAvgStrategy",
    "fedavgm": "strategies.base:FedAvgMStrategy",
    "fedadam": "strategies.base:FedAdamStrategy",
    "gne": "strategies.gne:GNEStrategy",
    "fedau": "strategies.fedau:FedAUStrategy",
    "pmfl": "strategies.fedau:PMFLStrategy",
    "fedccl": "strategies.fedccl:FedCCLStrategy",
    "fedcclm": "strategies.fedccl:FedCCLMStrategy",
    "fedcclgne": "strategies.fedccl:FedCCLGNEStrategy",
    "fedcclau": "strategies.fedccl:FedCCLAUStrategy",
    "fedccladam": "strategies.fedccl:FedCCLAdamStrategy",
}

_TABLES = {"client": CLIENTS, "server": SERVERS}


def _load(path: str) -> Any:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def resolve(section: str, name: str) -> Any:
    """The class registered as ``name`` for ``section`` ('client' or 'server')."""
    from fl_app.config import ConfigError

    table = _TABLES[section]
    if name not in table:
        raise ConfigError(
            f"unknown {section}.name {name!r}; choose one of {', '.join(sorted(table))}"
        )
    try:
        return _load(table[name])
    except (ImportError, AttributeError) as err:
        raise ConfigError(
            f"{section} {name!r} is registered as {table[name]} but cannot be loaded: {err}"
        ) from err


def params_class(section: str, name: str) -> type:
    """The ``Params`` dataclass holding the hyperparameters of a client or server."""
    return resolve(section, name).Params


def names_with_param(section: str, key: str) -> list[str]:
    """The registered ``section`` names whose ``Params`` declare ``key`` (for the error on a
    hyperparameter given to a class that does not have it)."""
    return [
        name
        for name in sorted(_TABLES[section])
        if key in {f.name for f in dataclasses.fields(params_class(section, name))}
    ]


def check_pairing(client: str, server: str) -> None:
    """Raise ``ConfigError`` unless the server merges what the client sends besides the model
    (the classes' ``payload``: FedCCL's signals need a FedCCL server, and a FedCCL server
    needs clients that send them); the message lists the servers that would fit."""
    from fl_app.config import ConfigError

    sent = resolve("client", client).payload
    if resolve("server", server).payload == sent:
        return
    fits = [name for name in SERVERS if resolve("server", name).payload == sent]
    what = f"sends {sent}" if sent else "sends no payload"
    raise ConfigError(
        f"client.name={client!r} {what}, which server.name={server!r} cannot take; "
        f"choose server.name from: {', '.join(fits)}"
    )
