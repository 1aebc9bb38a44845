"""The daemon's engine workers as Ray actors across a Ray cluster's nodes.

`[placement] backend = "ray"`: the daemon connects to the cluster as a Ray driver and
creates one actor per data-parallel rank (`workers` of them), each reserving the CPUs,
GPUs and custom resources of the [placement] table on its node, spread over the nodes.
A tensor-parallel worker (`tensor_parallel_size` > 1) gets a placement group of that many
bundles packed on one node (STRICT_PACK), its actor in bundle 0 and a rank holder in each
other (daemon/workers/ray_actor.py).
Ray restarts an actor whose process or node died (`max_restarts`), on any node with room;
the restarted worker registers again under the same id, from its new node, and the
daemon fails over what the lost one ran, as for any worker. The actors are the driver's
(not detached): they end with the daemon. Ray's calls block, so they run in threads, and
the actors' answers are awaited as asyncio futures.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import ray
from ray.exceptions import RayError
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from daemon.config import Config
from daemon.workers.placement_settings import (
    PlacementError,
    PlacementSettings,
    ray_address,
    unreachable,
)
from daemon.workers.ray_actor import EngineWorkerActor, RankHolder
from daemon.workers.supervisor import worker_args

log = logging.getLogger("agentd.placement")

WATCH_INTERVAL_S = 1.0  # how often the daemon asks each actor where it runs
ANSWER_TIMEOUT_S = 60.0  # an actor's first answer: Ray may need to start a worker process
NAME_FREE_TIMEOUT_S = 30.0  # for a killed leftover actor's name to be free again


class RayPlacement:
    def __init__(self, cfg: Config, settings: PlacementSettings, connect: str, key: str,
                 on_event: Callable[..., None]) -> None:
        self.cfg = cfg
        self.settings = settings
        self.connect = connect
        self.key = key
        self.on_event = on_event
        self.actors: dict[str, Any] = {}  # worker id -> actor handle
        self.nodes: dict[str, str] = {}  # worker id -> the Ray node id it last ran on
        self.groups: dict[str, tuple[PlacementGroup, list[Any]]] = {}  # tensor-parallel ones
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        address = ray_address(self.settings)
        if (problem := await asyncio.to_thread(unreachable, address)) is not None:
            raise PlacementError(problem)
        await asyncio.to_thread(ray.init, address=address, namespace=self.settings.namespace,
                                log_to_driver=True, configure_logging=False)
        log.info("placing %d %s worker(s) on the Ray cluster at %s", self.cfg.workers,
                 self.cfg.engine, address)
        for rank in range(self.cfg.workers):
            worker_id = f"ray-{self.cfg.engine}-{rank}"
            self.actors[worker_id] = await asyncio.to_thread(self._create, worker_id, rank)
            self._tasks.append(asyncio.create_task(self._watch(worker_id, rank)))

    def _create(self, worker_id: str, rank: int) -> Any:
        s = self.settings
        args = [*worker_args(self.cfg, self.connect, worker_id), "--dp-rank", str(rank)]
        strategy: Any = "SPREAD" if s.spread else "DEFAULT"
        holders: list[Any] = []
        if s.tensor_parallel_size > 1:
            group, holders = reserve_ranks(s, worker_id)
            self.groups[worker_id] = (group, holders)
            strategy = in_bundle(group, 0)
            args += ["--tensor-parallel-size", str(s.tensor_parallel_size)]
        actor = ray.remote(EngineWorkerActor).options(
            name=worker_id, num_cpus=s.num_cpus, num_gpus=s.num_gpus,
            resources=dict(s.resources), max_restarts=s.max_restarts,
            # A call that meets a restart fails at once; the watch asks again next round.
            max_task_retries=0, scheduling_strategy=strategy,
        )
        take_name(worker_id)
        return actor.remote(args, self.key, holders)

    async def _watch(self, worker_id: str, rank: int) -> None:
        """Trace where each worker runs, and each move Ray made after a failure."""
        while True:
            try:
                where = await asyncio.wait_for(
                    asyncio.wrap_future(self.actors[worker_id].where.remote().future()),
                    ANSWER_TIMEOUT_S)
            except (RayError, TimeoutError) as exc:  # restarting, or its node is gone
                log.debug("worker actor %s did not answer: %s", worker_id, exc)
            else:
                self._placed(worker_id, rank, where)
            await asyncio.sleep(WATCH_INTERVAL_S)

    def _placed(self, worker_id: str, rank: int, where: dict[str, Any]) -> None:
        before = self.nodes.get(worker_id)
        if before == where["ray_node_id"]:
            return
        self.nodes[worker_id] = where["ray_node_id"]
        kind = "worker.placed" if before is None else "worker.moved"
        log.info("%s: worker %s (rank %d) on node %s", kind, worker_id, rank, where["node"])
        self.on_event(kind, worker_id=worker_id, dp_rank=rank, node=where["node"],
                      ray_node_id=where["ray_node_id"], pid=where["pid"], gpus=where["gpus"])

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.to_thread(self._stop_actors)

    def _stop_actors(self) -> None:
        stops = {worker_id: actor.stop.remote() for worker_id, actor in self.actors.items()}
        for worker_id, ref in stops.items():
            # An actor on a lost node cannot answer; it is killed below all the same.
            with contextlib.suppress(RayError):
                ray.get(ref, timeout=15)
            ray.kill(self.actors[worker_id], no_restart=True)
        for group, holders in self.groups.values():
            for holder in holders:
                ray.kill(holder, no_restart=True)
            remove_placement_group(group)
        ray.shutdown()


def take_name(name: str) -> None:
    """Free the actor name `name` in this namespace: an actor holding it is a previous
    daemon's (one that died, whose driver Ray has not cleaned up yet, or one this daemon
    took the store's lease over from), and its worker must not serve on: killed. Ray frees
    the name once the actor is dead, which takes a moment."""
    deadline = time.monotonic() + NAME_FREE_TIMEOUT_S
    while True:
        try:
            leftover = ray.get_actor(name)
        except ValueError:  # no actor of that name: free
            return
        if time.monotonic() > deadline:
            raise PlacementError(f"the Ray actor name {name!r} is still held by another "
                                 f"actor after {NAME_FREE_TIMEOUT_S:.0f} s")
        log.warning("killing the leftover worker actor %s of an earlier daemon", name)
        ray.kill(leftover, no_restart=True)
        time.sleep(0.2)


def bundle(s: PlacementSettings) -> dict[str, float]:
    """One rank's resources (Ray refuses zero amounts in a bundle)."""
    wanted = {"CPU": s.num_cpus, "GPU": s.num_gpus, **s.resources}
    return {name: amount for name, amount in wanted.items() if amount > 0}


def in_bundle(group: PlacementGroup, index: int) -> PlacementGroupSchedulingStrategy:
    return PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=index)


def reserve_ranks(s: PlacementSettings, worker_id: str) -> tuple[PlacementGroup, list[Any]]:
    """A tensor-parallel worker's placement group, one bundle per rank on one node, and a
    rank holder in each bundle but the first (the worker's actor takes that one)."""
    group = placement_group([bundle(s)] * s.tensor_parallel_size, strategy="STRICT_PACK",
                            name=f"{worker_id}-ranks")
    holders = [ray.remote(RankHolder).options(
        num_cpus=s.num_cpus, num_gpus=s.num_gpus, resources=dict(s.resources),
        max_restarts=-1, scheduling_strategy=in_bundle(group, i)).remote()
        for i in range(1, s.tensor_parallel_size)]
    return group, holders
