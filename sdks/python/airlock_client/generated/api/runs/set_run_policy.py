from http import HTTPStatus
from typing import Any
from urllib.parse import quote

import httpx

from ... import errors
from ...client import AuthenticatedClient, Client
from ...models.error import Error
from ...models.run_policy import RunPolicy
from ...models.set_run_policy import SetRunPolicy
from ...types import UNSET, Response, Unset


def _get_kwargs(
    id: str,
    *,
    body: SetRunPolicy,
    wait: bool | Unset = UNSET,
) -> dict[str, Any]:
    headers: dict[str, Any] = {}

    params: dict[str, Any] = {}

    params["wait"] = wait

    params = {k: v for k, v in params.items() if v is not UNSET and v is not None}

    _kwargs: dict[str, Any] = {
        "method": "patch",
        "url": "/v1/runs/{id}/policy".format(
            id=quote(str(id), safe=""),
        ),
        "params": params,
    }

    _kwargs["json"] = body.to_dict()

    headers["Content-Type"] = "application/json"

    _kwargs["headers"] = headers
    return _kwargs


def _parse_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> Error | RunPolicy | None:
    if response.status_code == 200:
        response_200 = RunPolicy.from_dict(response.json())

        return response_200

    if response.status_code == 202:
        response_202 = RunPolicy.from_dict(response.json())

        return response_202

    if response.status_code == 400:
        response_400 = Error.from_dict(response.json())

        return response_400

    if response.status_code == 401:
        response_401 = Error.from_dict(response.json())

        return response_401

    if response.status_code == 404:
        response_404 = Error.from_dict(response.json())

        return response_404

    if response.status_code == 409:
        response_409 = Error.from_dict(response.json())

        return response_409

    if response.status_code == 413:
        response_413 = Error.from_dict(response.json())

        return response_413

    if response.status_code == 415:
        response_415 = Error.from_dict(response.json())

        return response_415

    if response.status_code == 422:
        response_422 = Error.from_dict(response.json())

        return response_422

    if response.status_code == 429:
        response_429 = Error.from_dict(response.json())

        return response_429

    if response.status_code == 500:
        response_500 = Error.from_dict(response.json())

        return response_500

    if response.status_code == 503:
        response_503 = Error.from_dict(response.json())

        return response_503

    if response.status_code == 507:
        response_507 = Error.from_dict(response.json())

        return response_507

    if client.raise_on_unexpected_status:
        raise errors.UnexpectedStatus(response.status_code, response.content)
    else:
        return None


def _build_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> Response[Error | RunPolicy]:
    return Response(
        status_code=HTTPStatus(response.status_code),
        content=response.content,
        headers=response.headers,
        parsed=_parse_response(client=client, response=response),
    )


def sync_detailed(
    id: str,
    *,
    client: AuthenticatedClient,
    body: SetRunPolicy,
    wait: bool | Unset = UNSET,
) -> Response[Error | RunPolicy]:
    """Replaces a running run's live egress rules within its manifest's (or `reset` to them).

    Args:
        id (str):
        wait (bool | Unset):
        body (SetRunPolicy): `PATCH /v1/runs/{id}/policy`: the run's new live rules (replacing
            every
            list: a list left out withdraws its manifest rules), or `reset` back to
            the manifest's. Give exactly one.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[Error | RunPolicy]
    """

    kwargs = _get_kwargs(
        id=id,
        body=body,
        wait=wait,
    )

    response = client.get_httpx_client().request(
        **kwargs,
    )

    return _build_response(client=client, response=response)


def sync(
    id: str,
    *,
    client: AuthenticatedClient,
    body: SetRunPolicy,
    wait: bool | Unset = UNSET,
) -> Error | RunPolicy | None:
    """Replaces a running run's live egress rules within its manifest's (or `reset` to them).

    Args:
        id (str):
        wait (bool | Unset):
        body (SetRunPolicy): `PATCH /v1/runs/{id}/policy`: the run's new live rules (replacing
            every
            list: a list left out withdraws its manifest rules), or `reset` back to
            the manifest's. Give exactly one.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Error | RunPolicy
    """

    return sync_detailed(
        id=id,
        client=client,
        body=body,
        wait=wait,
    ).parsed


async def asyncio_detailed(
    id: str,
    *,
    client: AuthenticatedClient,
    body: SetRunPolicy,
    wait: bool | Unset = UNSET,
) -> Response[Error | RunPolicy]:
    """Replaces a running run's live egress rules within its manifest's (or `reset` to them).

    Args:
        id (str):
        wait (bool | Unset):
        body (SetRunPolicy): `PATCH /v1/runs/{id}/policy`: the run's new live rules (replacing
            every
            list: a list left out withdraws its manifest rules), or `reset` back to
            the manifest's. Give exactly one.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[Error | RunPolicy]
    """

    kwargs = _get_kwargs(
        id=id,
        body=body,
        wait=wait,
    )

    response = await client.get_async_httpx_client().request(**kwargs)

    return _build_response(client=client, response=response)


async def asyncio(
    id: str,
    *,
    client: AuthenticatedClient,
    body: SetRunPolicy,
    wait: bool | Unset = UNSET,
) -> Error | RunPolicy | None:
    """Replaces a running run's live egress rules within its manifest's (or `reset` to them).

    Args:
        id (str):
        wait (bool | Unset):
        body (SetRunPolicy): `PATCH /v1/runs/{id}/policy`: the run's new live rules (replacing
            every
            list: a list left out withdraws its manifest rules), or `reset` back to
            the manifest's. Give exactly one.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Error | RunPolicy
    """

    return (
        await asyncio_detailed(
            id=id,
            client=client,
            body=body,
            wait=wait,
        )
    ).parsed
