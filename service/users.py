"""Users and their API tokens. Tokens are random, shown once, and stored as SHA-256."""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from sqlalchemy import bindparam, func, select

from shardline.service.db import Database
from shardline.service.models import ApiToken, User, utcnow
from shardline.service.principal import Principal

log = logging.getLogger(__name__)

TOKEN_PREFIX = "shl_"

_AUTHENTICATE = (
    select(User.id, User.name, User.is_admin)
    .join(ApiToken, ApiToken.user_id == User.id)
    .where(ApiToken.token_hash == bindparam("token_hash"), ApiToken.revoked_at.is_(None))
)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class IssuedToken:
    token: str  # the secret itself: shown once, never stored
    token_id: int
    user: User


@dataclass(frozen=True)
class TokenInfo:
    id: int
    user: str
    name: str
    prefix: str
    created_at: datetime
    revoked: bool


class UserDirectory:
    def __init__(self, db: Database) -> None:
        self.db = db

    def ensure_user(self, name: str, *, admin: bool = False) -> User:
        """The user called `name`, created if missing; `admin` only ever grants."""
        with self.db.session() as s:
            user = s.scalar(select(User).where(User.name == name))
            if user is None:
                user = User(name=name, is_admin=admin, created_at=utcnow())
                s.add(user)
            elif admin and not user.is_admin:
                user.is_admin = True
            s.commit()
            s.refresh(user)
            return user

    def find_user(self, name: str) -> User | None:
        with self.db.session() as s:
            return s.scalar(select(User).where(User.name == name))

    def issue_token(self, user: User, name: str) -> IssuedToken:
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        with self.db.session() as s:
            row = ApiToken(
                user_id=user.id,
                name=name,
                token_hash=hash_token(token),
                prefix=token[:12],
                created_at=utcnow(),
            )
            s.add(row)
            s.commit()
            return IssuedToken(token, row.id, user)

    def authenticate(self, token: str) -> Principal | None:
        """Who a live token belongs to, or None (unknown or revoked). Every request with a
        token it does not find in the read cache makes this read, so it is one Core
        select of three columns, no ORM load."""
        return self.authenticate_hash(hash_token(token))

    def authenticate_hash(self, token_hash: str) -> Principal | None:
        with self.db.reader() as conn:
            row = conn.execute(_AUTHENTICATE, {"token_hash": token_hash}).one_or_none()
        return None if row is None else Principal(row.id, row.name, row.is_admin)

    def live_token_hashes(self) -> frozenset[str]:
        """The hashes of every token issued and not revoked."""
        with self.db.reader() as conn:
            live = select(ApiToken.token_hash).where(ApiToken.revoked_at.is_(None))
            return frozenset(conn.scalars(live))

    def list_tokens(self) -> list[TokenInfo]:
        with self.db.session() as s:
            rows = s.execute(select(ApiToken, User.name).join(User).order_by(ApiToken.id))
            return [
                TokenInfo(t.id, user, t.name, t.prefix, t.created_at, t.revoked_at is not None)
                for t, user in rows
            ]

    def revoke(self, token_id: int) -> bool:
        """Revoke a token by id; False if there is no such live token."""
        with self.db.session() as s:
            row = s.get(ApiToken, token_id)
            if row is None or row.revoked_at is not None:
                return False
            row.revoked_at = utcnow()
            s.commit()
            return True

    def has_users(self) -> bool:
        with self.db.session() as s:
            return bool(s.scalar(select(func.count()).select_from(User)))


def bootstrap_admin(users: UserDirectory, token_file: Path) -> str | None:
    """On an empty database: create `admin` and a token, save it (0600); returns the token."""
    if users.has_users():
        return None
    issued = users.issue_token(users.ensure_user("admin", admin=True), "bootstrap")
    token_file.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(issued.token + "\n")
    os.chmod(token_file, 0o600)  # also when the file already existed with looser bits
    log.warning("created admin user; token saved to %s", token_file)
    return issued.token
