"""What ``check`` computes: recorded calls replayed against a target and the answers judged (:mod:`.replay`)."""
