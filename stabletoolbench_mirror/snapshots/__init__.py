"""The store and upstream's ``tool_response_cache`` trees: import (:mod:`.tree_import`), export and counts
(:mod:`.tree_export`), snapshots written and verified (:mod:`.snapshot`)."""
