"""The AWS boundary, shared by every role: clients, one retriable-or-fatal classification, S3 URIs and I/O.

clients (lazy, injectable boto3 clients), errors (classify / translate every AWS error once),
s3uri (s3:// URIs and key rules), store (every role's objects by URI: S3 or a local directory),
ranged (an object's bytes by ranged reads), sigv4 (signing for AMP's query API).
"""
