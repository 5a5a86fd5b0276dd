"""llmbus.process.periodic.run_every: a failing run does not end the loop; a stop ends it mid-wait."""

from __future__ import annotations

import asyncio

from llmbus.process.periodic import run_every


async def test_runs_go_on_after_a_failure_and_stop_ends_the_wait_at_once() -> None:
    runs: list[int] = []
    third = asyncio.Event()

    async def job() -> None:
        runs.append(len(runs))
        if len(runs) == 3:
            third.set()
        if len(runs) == 1:
            raise ConnectionError("redis hiccup")

    stop = asyncio.Event()
    loop = asyncio.create_task(run_every(0.01, job, name="probe", stop=stop, at_once=True))
    await asyncio.wait_for(third.wait(), 10)
    assert runs[:3] == [0, 1, 2]  # the first run failed, the later ones still came
    slow = asyncio.create_task(run_every(3600, job, name="hourly", stop=stop))
    await asyncio.sleep(0)
    stop.set()
    await asyncio.wait_for(asyncio.gather(loop, slow), 5)  # an hour's wait ends with the stop


async def test_without_at_once_the_first_run_waits_one_interval() -> None:
    ran = asyncio.Event()

    async def job() -> None:
        ran.set()

    stop = asyncio.Event()
    task = asyncio.create_task(run_every(3600, job, name="hourly", stop=stop))
    await asyncio.sleep(0.05)
    assert not ran.is_set()
    stop.set()
    await asyncio.wait_for(task, 5)
    assert not ran.is_set()
