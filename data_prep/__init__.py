"""Turn raw corpora (POP909, Bach chorales, MMA grooves, Pop1K7, Groove2Groove) into token shards."""
