"""The call and its keys, the records, outcomes and secrets: what every layer above shares."""
