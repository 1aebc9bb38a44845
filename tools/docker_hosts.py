"""Several Docker engines as one `docker` backend: pools of hosts, placement by load.

A tool spec names a pool (`pool = "cpu"`, else "default"); a pool names Docker engines by
URL (unix://…, tcp://…). A program's first container in a pool goes to the pool's
least-loaded reachable engine, and every later one of that program in that pool follows it,
so a program's tools can share volumes and see each other's files on one host.

Load is the number of live (created or running) containers labelled with the pool on the
engine, any daemon's, plus the creations this daemon has in flight there: counted from the
engine at placement time, so containers started by another daemon, or left by a crash,
count too. An engine that does not answer is skipped (logged) and asked again at the next
placement, listing or sweep; only when no engine of a pool answers does creation fail.
Listings and reclamation go to every engine, each on its own: one engine down is reported
by `hosts_down()` and never stops the others.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, OrderedDict
from collections.abc import Mapping, Sequence

from tools.base import Environment, ExecResult, OutputListener, Owner, Resource
from tools.docker_backend import DockerBackend
from tools.errors import Reason, ToolError
from tools.spec import DEFAULT_POOL, ToolSpec

log = logging.getLogger(__name__)

_PLACEMENTS_KEPT = 10_000  # (program, pool) -> host remembered; the engines' labels are truth


class DockerHosts:
    kind = "docker"

    def __init__(self, pools: Mapping[str, Sequence[str]] | None = None) -> None:
        """`pools`: host URLs by pool name. Without a "default" pool, specs naming none go
        to the engine of DOCKER_HOST (or the system socket), as with one engine."""
        self._engines: dict[str, DockerBackend] = {}
        self._pools: dict[str, list[str]] = {}
        for name, urls in (pools or {}).items():
            self._pools[name] = [self._engine(url).host for url in urls]
        if DEFAULT_POOL not in self._pools:
            local = DockerBackend()
            self._engines.setdefault(local.host, local)
            self._pools[DEFAULT_POOL] = [local.host]
        self._placed: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._placing: dict[tuple[str, str], asyncio.Task[str]] = {}
        self._creating: Counter[str] = Counter()
        self._reserved: dict[tuple[str, str], str] = {}  # placements counted in _creating
        self._down: dict[str, str] = {}

    def _engine(self, url: str) -> DockerBackend:
        if url not in self._engines:
            self._engines[url] = DockerBackend(url)
        return self._engines[url]

    @property
    def pools(self) -> dict[str, list[str]]:
        return {name: list(hosts) for name, hosts in self._pools.items()}

    def hosts(self) -> list[str]:
        return list(self._engines)

    def hosts_down(self) -> dict[str, str]:
        return dict(self._down)

    # -- placing ----------------------------------------------------------------------------

    async def create(self, owner: Owner, spec: ToolSpec) -> Environment:
        pool = spec.pool or DEFAULT_POOL
        host = await self.place(owner, pool)
        # A placement counts its creation as in flight from the moment it chooses (see
        # _least_loaded); a creation that placed nothing new counts its own.
        if self._reserved.pop((owner.program_id, pool), None) != host:
            self._creating[host] += 1
        try:
            return await self._engines[host].create(owner, spec)
        finally:
            self._creating[host] -= 1

    async def place(self, owner: Owner, pool: str) -> str:
        """The host of `owner`'s program in `pool`: where it already is, else the least
        loaded. One placement per (program, pool) at a time, so two tools of a program
        prepared together cannot be split across hosts."""
        if pool not in self._pools:
            raise ToolError(Reason.BAD_SPEC, f"pool: no tool pool named {pool!r} is configured "
                            f"(configured: {', '.join(sorted(self._pools))})", tool=owner.tool)
        key = (owner.program_id, pool)
        if key in self._placed:
            self._placed.move_to_end(key)
            return self._placed[key]
        task = self._placing.get(key)
        if task is None:
            task = asyncio.ensure_future(self._least_loaded(owner, pool))
            self._placing[key] = task
            task.add_done_callback(lambda _: self._placing.pop(key, None))
        host = await asyncio.shield(task)
        self._placed[key] = host
        while len(self._placed) > _PLACEMENTS_KEPT:
            self._placed.popitem(last=False)
        return host

    async def _least_loaded(self, owner: Owner, pool: str) -> str:
        hosts = self._pools[pool]
        answers = await asyncio.gather(
            *(self._engines[h].live_containers(pool, owner) for h in hosts),
            return_exceptions=True)
        loads: list[tuple[int, int, str]] = []
        for order, (host, answer) in enumerate(zip(hosts, answers, strict=True)):
            if isinstance(answer, BaseException):
                self._note_down(host, answer)
                continue
            self._down.pop(host, None)
            count, held = answer
            if held:  # the program is there already (an earlier run of this daemon too)
                return host
            loads.append((count + self._creating[host], order, host))
        if not loads:
            raise ToolError(Reason.ENGINE_DOWN, f"no Docker engine of pool {pool!r} answers: "
                            + "; ".join(f"{h}: {self._down.get(h, '?')}" for h in hosts),
                            tool=owner.tool)
        host = min(loads)[2]
        # Counted now, in the same step as the choice: a placement whose engine answers
        # come in before this one's creation starts must see it (both saw 0 and 0 else).
        self._creating[host] += 1
        self._reserved[(owner.program_id, pool)] = host
        return host

    def _note_down(self, host: str, exc: BaseException) -> None:
        if not isinstance(exc, ToolError):
            raise exc
        if host not in self._down:
            log.warning("Docker engine %s does not answer (skipped until it does): %s",
                        host, exc.message)
        self._down[host] = exc.message

    # -- using ------------------------------------------------------------------------------

    def _holder(self, host: str) -> DockerBackend:
        engine = self._engines.get(host)
        if engine is None:
            raise ToolError(Reason.ENGINE_DOWN, f"Docker engine {host!r} is not configured")
        return engine

    async def exec(self, env: Environment, argv: Sequence[str], timeout_s: float,
                   on_output: OutputListener | None = None) -> ExecResult:
        return await self._holder(env.host).exec(env, argv, timeout_s, on_output)

    async def put_file(self, env: Environment, path: str, data: bytes, mode: int = 0o644) -> None:
        await self._holder(env.host).put_file(env, path, data, mode)

    async def get_file(self, env: Environment, path: str) -> bytes:
        return await self._holder(env.host).get_file(env, path)

    # -- listing and reclaiming ---------------------------------------------------------------

    async def resources(
        self, daemon_id: str, program_id: str | None = None, *, sizes: bool = False
    ) -> list[Resource]:
        """What every engine holds; an engine down is noted and skipped. Raises only when
        none answers, so a single-engine setup reports its engine down as before."""
        hosts = list(self._engines)
        answers = await asyncio.gather(
            *(self._engines[h].resources(daemon_id, program_id, sizes=sizes) for h in hosts),
            return_exceptions=True)
        found: list[Resource] = []
        for host, answer in zip(hosts, answers, strict=True):
            if isinstance(answer, BaseException):
                self._note_down(host, answer)
                continue
            self._down.pop(host, None)
            found += answer
        if len(self._down) == len(hosts) and hosts:
            raise ToolError(Reason.ENGINE_DOWN, "; ".join(
                f"{h}: {m}" for h, m in sorted(self._down.items())))
        return found

    async def reclaim(self, resource: Resource) -> None:
        await self._holder(resource.host).reclaim(resource)
