package dpstream.bench;

import java.lang.management.ManagementFactory;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Consumed;

/**
 * The Kafka Streams peer of dpstream's benchmark: a running per-user count over a topic keyed
 * by user id, {@code groupByKey().count()} with the default (RocksDB, cached) store, everything
 * else at Kafka Streams' defaults.
 *
 * <p>Arguments: bootstrap topic records guarantee application-id state-dir [timeout-seconds].
 * It stops itself once {@code records} records have been counted and prints one JSON line:
 * records, first-to-last-record seconds, wall seconds from JVM start to the last record, CPU
 * seconds of the process at exit and its peak RSS (VmHWM). Exit status 0 when all records
 * came, 2 on a timeout (the line still says how many did).
 */
public final class PeerCount {
  private PeerCount() {}

  public static void main(String[] args) throws Exception {
    if (args.length < 6) {
      System.err.println(
          "usage: PeerCount bootstrap topic records at_least_once|exactly_once_v2"
              + " application-id state-dir [timeout-seconds]");
      System.exit(64);
    }
    String bootstrap = args[0];
    String topic = args[1];
    long target = Long.parseLong(args[2]);
    String guarantee = args[3];
    String appId = args[4];
    String stateDir = args[5];
    long timeoutSeconds = args.length > 6 ? Long.parseLong(args[6]) : 600;

    Properties props = new Properties();
    props.put(StreamsConfig.APPLICATION_ID_CONFIG, appId);
    props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, guarantee);
    props.put(StreamsConfig.STATE_DIR_CONFIG, stateDir);
    props.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
    // Leave the group on close (Streams stays in it by default), so the harness can delete the
    // run's group at once; it does not change how records are processed.
    props.put(StreamsConfig.mainConsumerPrefix("internal.leave.group.on.close"), true);

    AtomicLong seen = new AtomicLong();
    long[] firstLast = new long[2];
    CountDownLatch done = new CountDownLatch(1);

    StreamsBuilder builder = new StreamsBuilder();
    builder.stream(topic, Consumed.with(Serdes.String(), Serdes.ByteArray()))
        .peek(
            (key, value) -> {
              long n = seen.incrementAndGet();
              if (n == 1) {
                firstLast[0] = System.nanoTime();
              }
              if (n == target) {
                firstLast[1] = System.nanoTime();
                done.countDown();
              }
            })
        .groupByKey()
        .count();

    KafkaStreams streams = new KafkaStreams(builder.build(), props);
    streams.setUncaughtExceptionHandler(
        e -> {
          e.printStackTrace();
          done.countDown();
          return org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler
              .StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
    streams.start();
    // The latch also opens when a stream thread dies: complete only if every record came.
    boolean complete = done.await(timeoutSeconds, TimeUnit.SECONDS) && seen.get() >= target;
    long lastNanos = complete ? firstLast[1] : System.nanoTime();
    long lastMillis = System.currentTimeMillis() - (System.nanoTime() - lastNanos) / 1_000_000;
    streams.close(Duration.ofSeconds(60));

    long count = Math.min(seen.get(), target);
    double span = count > 0 ? (lastNanos - firstLast[0]) / 1e9 : Double.NaN;
    double wall = (lastMillis - ManagementFactory.getRuntimeMXBean().getStartTime()) / 1e3;
    com.sun.management.OperatingSystemMXBean os =
        (com.sun.management.OperatingSystemMXBean) ManagementFactory.getOperatingSystemMXBean();
    double cpu = os.getProcessCpuTime() / 1e9;
    System.out.printf(
        "{\"peer\": \"kafka-streams\", \"guarantee\": \"%s\", \"records\": %d,"
            + " \"span_seconds\": %s, \"wall_seconds\": %.3f, \"cpu_seconds\": %.3f,"
            + " \"peak_rss\": %d}%n",
        guarantee,
        count,
        Double.isNaN(span) ? "null" : String.format("%.6f", span),
        wall,
        cpu,
        peakRss());
    System.out.flush();
    System.exit(complete ? 0 : 2);
  }

  /** VmHWM of this process in bytes, -1 where /proc is not there. */
  private static long peakRss() {
    try {
      for (String line : Files.readAllLines(Path.of("/proc/self/status"))) {
        if (line.startsWith("VmHWM:")) {
          return Long.parseLong(line.replaceAll("[^0-9]", "")) * 1024;
        }
      }
    } catch (Exception e) {
      // not Linux
    }
    return -1;
  }
}
