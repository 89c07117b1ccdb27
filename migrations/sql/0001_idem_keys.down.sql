DROP TABLE IF EXISTS {{schema}}idem_keys;
