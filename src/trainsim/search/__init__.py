"""Searches over configurations, each scored by the simulator: LLM parallel plans
(:mod:`.llm`, :mod:`.space`) and DLRM embedding-table sharders (:mod:`.sharders`)."""
