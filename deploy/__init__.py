"""A real Apache Kafka broker for tests, the demo and the CLI (``dpstream.deploy``).

``broker``: the broker chooser (``KAFKA_BOOTSTRAP_SERVERS``, a container where Docker
answers, else Kafka's own jars) and the local KRaft launcher. The files beside this one
(pom.xml, docker-compose.yml, Dockerfile, images.sh) deploy dpstream and its broker.
"""
