from http import HTTPStatus
from typing import Any

import httpx

from ... import errors
from ...client import AuthenticatedClient, Client
from ...models.error import Error
from ...models.org_proxy import OrgProxy
from ...models.set_org_proxy import SetOrgProxy
from ...types import Response


def _get_kwargs(
    *,
    body: SetOrgProxy,
) -> dict[str, Any]:
    headers: dict[str, Any] = {}

    _kwargs: dict[str, Any] = {
        "method": "put",
        "url": "/v1/org/proxy",
    }

    _kwargs["json"] = body.to_dict()

    headers["Content-Type"] = "application/json"

    _kwargs["headers"] = headers
    return _kwargs


def _parse_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> Error | OrgProxy | None:
    if response.status_code == 200:
        response_200 = OrgProxy.from_dict(response.json())

        return response_200

    if response.status_code == 400:
        response_400 = Error.from_dict(response.json())

        return response_400

    if response.status_code == 401:
        response_401 = Error.from_dict(response.json())

        return response_401

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
) -> Response[Error | OrgProxy]:
    return Response(
        status_code=HTTPStatus(response.status_code),
        content=response.content,
        headers=response.headers,
        parsed=_parse_response(client=client, response=response),
    )


def sync_detailed(
    *,
    client: AuthenticatedClient,
    body: SetOrgProxy,
) -> Response[Error | OrgProxy]:
    """Chooses the operator proxy the organization's runs go through (`null`:
    none); runs started from then use it.

    Args:
        body (SetOrgProxy): `PUT /v1/org/proxy`: the operator proxy the organization's runs go
            through, by one of the names offered (`null`: none); a name not offered
            is refused (422). Runs started from then use it.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[Error | OrgProxy]
    """

    kwargs = _get_kwargs(
        body=body,
    )

    response = client.get_httpx_client().request(
        **kwargs,
    )

    return _build_response(client=client, response=response)


def sync(
    *,
    client: AuthenticatedClient,
    body: SetOrgProxy,
) -> Error | OrgProxy | None:
    """Chooses the operator proxy the organization's runs go through (`null`:
    none); runs started from then use it.

    Args:
        body (SetOrgProxy): `PUT /v1/org/proxy`: the operator proxy the organization's runs go
            through, by one of the names offered (`null`: none); a name not offered
            is refused (422). Runs started from then use it.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Error | OrgProxy
    """

    return sync_detailed(
        client=client,
        body=body,
    ).parsed


async def asyncio_detailed(
    *,
    client: AuthenticatedClient,
    body: SetOrgProxy,
) -> Response[Error | OrgProxy]:
    """Chooses the operator proxy the organization's runs go through (`null`:
    none); runs started from then use it.

    Args:
        body (SetOrgProxy): `PUT /v1/org/proxy`: the operator proxy the organization's runs go
            through, by one of the names offered (`null`: none); a name not offered
            is refused (422). Runs started from then use it.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[Error | OrgProxy]
    """

    kwargs = _get_kwargs(
        body=body,
    )

    response = await client.get_async_httpx_client().request(**kwargs)

    return _build_response(client=client, response=response)


async def asyncio(
    *,
    client: AuthenticatedClient,
    body: SetOrgProxy,
) -> Error | OrgProxy | None:
    """Chooses the operator proxy the organization's runs go through (`null`:
    none); runs started from then use it.

    Args:
        body (SetOrgProxy): `PUT /v1/org/proxy`: the operator proxy the organization's runs go
            through, by one of the names offered (`null`: none); a name not offered
            is refused (422). Runs started from then use it.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Error | OrgProxy
    """

    return (
        await asyncio_detailed(
            client=client,
            body=body,
        )
    ).parsed
