//! Store-level tests of the MySQL / MariaDB dialect against a throwaway MariaDB.
