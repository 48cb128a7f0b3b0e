"""POST /v1/harvest, GET and DELETE /v1/harvest/{id}, and the signed downloads of its files."""
