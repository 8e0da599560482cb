"""Named dependencies, so every route reads the same way and none forgets auth."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from api.errors import ApiError
from service.config import Settings
from service.models import User
from service.runtime import Runtime
from service.store import JobStore
from service.users import UserDirectory

_bearer = HTTPBearer(auto_error=False, description="An API token: `shardline token create`")


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_store(request: Request) -> JobStore:
    return request.app.state.store


def get_runtime(request: Request) -> Runtime:
    return request.app.state.runtime


def get_current_user(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> User:
    challenge = {"WWW-Authenticate": "Bearer"}
    if credentials is None:
        raise ApiError(401, "unauthorized", "missing bearer token", headers=challenge)
    users: UserDirectory = request.app.state.users
    user = users.authenticate(credentials.credentials)
    if user is None:
        raise ApiError(401, "unauthorized", "invalid or revoked token", headers=challenge)
    return user


SettingsDep = Annotated[Settings, Depends(get_settings)]
StoreDep = Annotated[JobStore, Depends(get_store)]
RuntimeDep = Annotated[Runtime, Depends(get_runtime)]
CurrentUser = Annotated[User, Depends(get_current_user)]
