import numpy as np


def _dist(a, b):
    return np.sqrt(sum(float(((x - y) ** 2).sum()) for x, y in zip(a, b, strict=True)))


def test_proximal_term_keeps_weights_closer_to_global(make_client, global_weights):
    w0 = global_weights(make_client("fedprox"))
    free = make_client("fedprox", overrides="client.mu=0.0").fit(w0, {"server-round": 1})[0]
    prox = make_client("fedprox", overrides="client.mu=10.0").fit(w0, {"server-round": 1})[0]
    assert _dist(prox, w0) < 0.8 * _dist(free, w0)
