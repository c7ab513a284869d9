"""noetl_stream.dataplane"""
