"""noetl_stream.kv"""
