-- oz0: expand
-- A placeholder for branch i42_low_tenants's migration 0027, so that this branch's 0028 has no gap:
-- dropped when the branches are merged (the real 0027 takes its place).
SELECT 1;
