"""noetl_stream.control"""
