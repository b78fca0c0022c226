-- tessera MySQL / MariaDB schema, version 3: a holder's doorbell (notify.rs).
--
-- Where to ring the holder's client when a revoke or a delete removes its lease, so that its
-- lost() fires at once instead of at its next renewal. The holder's client writes it once it
-- holds the lease and its doorbell is parked (mod.rs, `claim`); '' for none: rows written
-- before this migration, by the procedures (which do not know the column), with wake=poll, or
-- before the claim. A revoke or delete of such a row rings nobody, and the holder learns of it
-- at its next renewal, as before.
--
-- Idempotent as every migration: MySQL 8 has no ADD COLUMN IF NOT EXISTS, so migrate.rs skips
-- an ALTER TABLE … ADD COLUMN whose column is there (tables created since carry it, see
-- schema.sql) and takes "duplicate column" (1060) as done. A user who may not ALTER (1142)
-- leaves the schema at version 2: that client runs without holders' doorbells (mod.rs).
ALTER TABLE tessera_holders
    ADD COLUMN doorbell VARCHAR(80) CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT ''
