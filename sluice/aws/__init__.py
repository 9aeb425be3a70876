"""The AWS boundary, shared by every role: clients, one retriable-or-fatal classification, S3 URIs and I/O.

clients (lazy, injectable boto3 clients), errors (classify / translate every AWS error once),
s3uri (s3:// parsing and key rules), s3io (read and write a run's objects by URI), sigv4
(signing for AMP's query API).
"""
