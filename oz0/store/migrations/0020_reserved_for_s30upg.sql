-- Placeholder so that this branch (s30ret) numbers its migrations without a gap: 0020 is
-- s30upg's, if it needs one. Deleted when that branch is merged (or renumbered if not).
SELECT 1;
