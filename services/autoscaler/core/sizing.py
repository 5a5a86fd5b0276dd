"""Pool size for an arrival rate: Little's law for the work in service, Erlang C for the queue.

A worker runs up to `slots` requests at once (vLLM's max_num_seqs; the scheduler places no
more), each taking `service_s` on average as measured. With `n` workers the pool is an
M/M/c queue of c = n x slots servers: the mean wait of a request is Erlang C's
C(c, a) / (c mu - lambda). Utilisation is also capped, since service time grows with batch size.
"""

from __future__ import annotations

import math


def erlang_c_wait_s(servers: int, rate_per_s: float, service_s: float) -> float:
    """Mean queue wait of an M/M/c queue (inf when it is overloaded)."""
    if rate_per_s <= 0:
        return 0.0
    offered = rate_per_s * service_s  # Erlangs: the busy servers Little's law asks for
    if servers <= offered:
        return math.inf
    erlang_b = 1.0
    for k in range(1, servers + 1):
        erlang_b = offered * erlang_b / (k + offered * erlang_b)
    wait_prob = servers * erlang_b / (servers - offered * (1 - erlang_b))
    return wait_prob * service_s / (servers - offered)


def replicas_for(
    rate_per_s: float,
    service_s: float,
    slots_per_worker: int,
    target_wait_s: float,
    max_utilisation: float,
    max_replicas: int,
) -> int:
    """Fewest workers keeping mean queue wait under target and utilisation under the cap."""
    if rate_per_s <= 0:
        return 0
    offered = rate_per_s * service_s  # Little's law: requests in service
    n = max(1, math.ceil(offered / (slots_per_worker * max_utilisation)))
    if n >= max_replicas:
        return max_replicas
    # Erlang B by its recurrence up to c = n x slots, then one more worker at a time.
    erlang_b, k = 1.0, 0
    while True:
        servers = n * slots_per_worker
        while k < servers:
            k += 1
            erlang_b = offered * erlang_b / (k + offered * erlang_b)
        if servers > offered:
            wait_prob = servers * erlang_b / (servers - offered * (1 - erlang_b))
            if wait_prob * service_s / (servers - offered) <= target_wait_s:
                return n
        if n >= max_replicas:
            return max_replicas
        n += 1
