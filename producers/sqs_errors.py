"""Where botocore's, aiohttp's and the socket's errors become ``producers.exceptions`` ones.

``translate_error`` (and ``translated``, the same around a block) is the one place that reads
botocore's and aiohttp's error classes; the cause is kept, credentials never show.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import aiohttp
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    NoCredentialsError,
    ParamValidationError,
    PartialCredentialsError,
)

from producers.exceptions import (
    BrokerRequestFailed,
    BrokerUnavailable,
    ProducerConfigError,
    ProducerError,
    translating,
)

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

_CONFIG_ERROR_CODES: Final = frozenset(
    {
        "AWS.SimpleQueueService.NonExistentQueue",
        "QueueDoesNotExist",
        "AccessDenied",
        "AccessDeniedException",
        "InvalidClientTokenId",
        "SignatureDoesNotMatch",
        "UnrecognizedClientException",
        "InvalidSecurity",
        "InvalidAddress",
        "KMS.AccessDeniedException",
    }
)
_TRANSIENT_ERROR_CODES: Final = frozenset(
    {"ThrottlingException", "RequestThrottled", "ServiceUnavailable", "InternalError"}
)
_TRANSLATED: Final = (ClientError, BotoCoreError, aiohttp.ClientError, OSError, TimeoutError)


def translate_error(exc: BaseException, *, action: str, queue_url: str) -> ProducerError:
    """The ``producers.exceptions`` error for a botocore / aiohttp / OS error of ``action``."""
    where = f"SQS {action} on {queue_url}"
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        detail = f"{where} failed: {code}: {error.get('Message', '')}"
        if code in _CONFIG_ERROR_CODES or error.get("QueryErrorCode") in _CONFIG_ERROR_CODES:
            return ProducerConfigError(
                f"{detail}. Check the trigger's queue_url, region_name and credentials"
            )
        if code in _TRANSIENT_ERROR_CODES or status >= 500:
            return BrokerUnavailable(
                f"{detail}; the watchers restart with backoff", address=queue_url
            )
        return BrokerRequestFailed(detail)
    if isinstance(exc, NoCredentialsError | PartialCredentialsError | ParamValidationError):
        return ProducerConfigError(
            f"{where}: {exc}. Give the trigger aws_access_key_id / aws_secret_access_key "
            "(or configure the default AWS credential chain)"
        )
    return BrokerUnavailable(
        f"{where} failed: cannot reach the endpoint ({exc}); the watchers restart with "
        "backoff. Check the trigger's endpoint_url / region_name and the network",
        address=queue_url,
    )


def translated(action: str, queue_url: str) -> AbstractContextManager[None]:
    """``translate_error`` for each botocore / OS error the block raises."""
    return translating(_TRANSLATED, translate_error, action=action, queue_url=queue_url)
