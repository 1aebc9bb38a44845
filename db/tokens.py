"""API tokens in the store: only SHA-256 hashes of the secrets are ever written."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from db.models import ApiToken


@dataclass(frozen=True, slots=True)
class TokenRecord:
    id: str
    name: str
    scopes: frozenset[str]
    created_at: float
    revoked_at: float | None
    tenant: str  # the stored tenant, or the token's id when it has none

    @property
    def active(self) -> bool:
        return self.revoked_at is None


def hash_secret(secret: str) -> str:
    # A plain hash is enough: secrets are 256-bit random, so there is nothing to brute-force
    # and no need for a slow KDF on the per-request path.
    return hashlib.sha256(secret.encode()).hexdigest()


def _record(row: ApiToken) -> TokenRecord:
    return TokenRecord(id=row.id, name=row.name, scopes=frozenset(row.scopes.split()),
                       created_at=row.created_at, revoked_at=row.revoked_at,
                       tenant=row.tenant or row.id)


async def insert(
    s: AsyncSession, token_id: str, name: str, token_hash: str, scopes: frozenset[str],
    now: float, tenant: str | None = None,
) -> TokenRecord:
    row = ApiToken(id=token_id, name=name, token_hash=token_hash,
                   scopes=" ".join(sorted(scopes)), created_at=now, revoked_at=None,
                   tenant=tenant)
    s.add(row)
    await s.flush()
    return _record(row)


async def find_by_hash(s: AsyncSession, token_hash: str) -> TokenRecord | None:
    row = await s.scalar(select(ApiToken).where(ApiToken.token_hash == token_hash))
    return None if row is None else _record(row)


async def list_all(s: AsyncSession) -> list[TokenRecord]:
    rows = await s.scalars(select(ApiToken).order_by(ApiToken.created_at, ApiToken.id))
    return [_record(r) for r in rows]


async def count(s: AsyncSession) -> int:
    return int(await s.scalar(select(func.count()).select_from(ApiToken)) or 0)


async def revoke(s: AsyncSession, token_id: str, now: float) -> TokenRecord | None:
    """Revoke once; revoking again keeps the first time. None if the id is unknown."""
    await s.execute(update(ApiToken)
                    .where(ApiToken.id == token_id, ApiToken.revoked_at.is_(None))
                    .values(revoked_at=now))
    row = await s.get(ApiToken, token_id, populate_existing=True)
    return None if row is None else _record(row)
