"""Several assets watching ONE SQS queue through ONE shared long poll, filtered per asset.

A message is deleted only once every watcher has processed it and the asset events derived
from it are stored; a message no watcher could process becomes visible again at once. With
no endpoint reachable, the watchers retry with backoff and say so.

Set SLUICE_EXAMPLE_SQS_QUEUE_URL and SLUICE_EXAMPLE_SQS_ENDPOINT (for a local server such as
moto or localstack), then send JSON bodies such as {"kind": "invoice", "id": 7}.
"""

from __future__ import annotations

import os

from engine import DAG, Asset, AssetWatcher, task
from producers import SqsMessageTrigger

QUEUE_URL = os.environ.get(
    "SLUICE_EXAMPLE_SQS_QUEUE_URL", "http://127.0.0.1:5000/123456789012/documents"
)
ENDPOINT = os.environ.get("SLUICE_EXAMPLE_SQS_ENDPOINT", "http://127.0.0.1:5000")


def documents_trigger(kind: str) -> SqsMessageTrigger:
    return SqsMessageTrigger(
        queue_url=QUEUE_URL,
        region_name="us-east-1",
        endpoint_url=ENDPOINT,
        # A local server (moto, localstack) accepts any credentials; for AWS, give real ones:
        # they are stored only encrypted, like every trigger kwarg.
        aws_access_key_id=os.environ.get("SLUICE_EXAMPLE_SQS_KEY_ID", "testing"),
        aws_secret_access_key=os.environ.get("SLUICE_EXAMPLE_SQS_SECRET", "testing"),
        body_filter={"kind": kind},
    )


invoices = Asset("sqs-invoices", watchers=[AssetWatcher("invoices", documents_trigger("invoice"))])
receipts = Asset("sqs-receipts", watchers=[AssetWatcher("receipts", documents_trigger("receipt"))])


@task
def file_documents(triggering_asset_events: dict[str, list[dict[str, object]]]) -> list[str]:
    return sorted(triggering_asset_events)


with DAG("sqs_documents", schedule=[invoices, receipts]) as dag:
    file_documents()
