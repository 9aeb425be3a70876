"""The runs table: its items, its DynamoDB plumbing, and its two views (the ledger's RUN items, the records)."""
