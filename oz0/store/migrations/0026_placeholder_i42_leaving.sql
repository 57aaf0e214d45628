-- oz0: expand
-- A placeholder for branch i42_leaving's migration 0026, so that this branch's 0028 has no gap:
-- dropped when the branches are merged (the real 0026 takes its place).
SELECT 1;
