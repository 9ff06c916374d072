"""StableToolBench's and ToolBench's formats and rules: the cache tree, tool docs, queries, answers, validity."""
