"""Agent self-update: versions, the versions store beside the running one, the update and its rollback."""
