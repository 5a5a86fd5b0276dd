"""Compare-and-set of experiment records: the one place that decides an experiment's next version.

Two writers change an experiment: operators (`llmbus experiments …`) and the shadow-comparator's
decision loop. Each reads the experiment, changes it and publishes it on the compacted
llm.experiments. A change made on an old read (the comparator promoting a step it read before an
operator's stop) must not win: before it is published, a change is written here as version
read + 1, only if no version above `read` is here already. The record is kept beside its version,
so a writer that loses reads what won, and a change whose publish never happened (a crash between
the two) can be published again by whoever finds it newer than the log.

One hash per experiment, `llmbus:<prefix>experiments:<id>` (fields `version`, `record`): one key per
script, so it runs on a Redis Cluster as on one Redis. A hash that is missing (a Redis that lost its
data, experiments from before versions) takes the first write; so does one older than the writer's
read (the writer has seen what Redis lost).
"""

from __future__ import annotations

import redis.asyncio as redis

from llmbus.contract.messages import Experiment
from llmbus.state.keys import experiment_key_root

# KEYS[1]: the experiment's hash. ARGV: the version the writer read, the new version, the new record.
# Returns 1 when written, else the record in force (the writer read an older version than it).
_CAS = """
local current = redis.call('HGET', KEYS[1], 'version')
if current and tonumber(current) > tonumber(ARGV[1]) then
  return redis.call('HGET', KEYS[1], 'record')
end
redis.call('HSET', KEYS[1], 'version', ARGV[2], 'record', ARGV[3])
return 1
"""


class ExperimentVersions:
    def __init__(self, client: redis.Redis, topic_prefix: str) -> None:
        self._client = client
        self._prefix = experiment_key_root(topic_prefix)
        self._cas = client.register_script(_CAS)

    def _key(self, experiment_id: str) -> str:
        return self._prefix + experiment_id

    async def latest(self, experiment_id: str) -> Experiment | None:
        """The newest version written here (it may not be on llm.experiments yet)."""
        raw = await self._client.hget(self._key(experiment_id), "record")
        return Experiment.model_validate_json(raw) if raw is not None else None

    async def compare_and_set(self, read_version: int, updated: Experiment) -> tuple[bool, Experiment | None]:
        """Write `updated` (its version read_version + 1) unless a version above `read_version` is here:
        (True, updated), else (False, the record in force)."""
        if updated.version != read_version + 1:
            raise ValueError(f"version {updated.version} does not follow the version read, {read_version}")
        reply = await self._cas(
            keys=[self._key(updated.experiment_id)], args=[read_version, updated.version, updated.to_bytes()]
        )
        if reply == 1:
            return True, updated
        return False, Experiment.model_validate_json(reply) if reply else None
