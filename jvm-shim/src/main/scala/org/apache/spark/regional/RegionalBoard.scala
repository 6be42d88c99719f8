package org.apache.spark.regional

import java.nio.charset.StandardCharsets
import java.util.concurrent.ConcurrentHashMap

import scala.jdk.CollectionConverters._
import scala.util.control.NonFatal

import com.fasterxml.jackson.databind.{JsonNode, ObjectMapper}
import org.apache.hadoop.fs.Path

import io.regional.shim.RegionalShim

/** A regional query run of this application, as the shim saw it start, and its newest status snapshot
  * (`<checkpoint>/regional/status.json`, written by the Python side after recorded epochs and at stop). */
final class QueryView(val id: String, val runId: String, val name: Option[String], val store: Path,
                      val startedAt: Long) {
  @volatile var ended: Option[String] = None  // Some("stopped") or Some("failed: <error>")
  @volatile private[regional] var snapshot: Option[JsonNode] = None
  @volatile private[regional] var readAt: Long = 0L
  @volatile private[regional] var stamp: String = ""  // the file's header line: its checksum
  @volatile var readError: Option[String] = None

  def label: String = name.getOrElse(id)
  def active: Boolean = ended.isEmpty
}

/** The queries the tab and the metrics show: every regional query started in this application (the newest run
  * of each query id), kept after they stop or fail, so that an on-call engineer sees how a query ended. */
object RegionalBoard {
  val StatusFile = "status.json"
  /** A running query's snapshot is read again at most this often, by the metrics updater's thread. */
  val RefreshMs = 1000L
  private val mapper = new ObjectMapper()
  private val queries = new ConcurrentHashMap[String, QueryView]()

  def started(id: String, runId: String, name: Option[String], store: Path): QueryView = {
    val view = new QueryView(id, runId, name.filter(_.nonEmpty), store, System.currentTimeMillis())
    Option(queries.put(id, view)).foreach(RegionalMetrics.remove)
    RegionalMetrics.register(view)
    view
  }

  def terminated(id: String, runId: String, error: Option[String]): Unit =
    Option(queries.get(id)).filter(_.runId == runId).foreach { view =>  // not a newer run of the same query
    // Spark's error holds the whole stack trace (Python's too): its first line says what failed.
    view.ended = Some(error.map(e => s"failed: ${e.linesIterator.find(_.trim.nonEmpty).getOrElse("").take(300)}")
      .getOrElse("stopped"))
    view.readAt = 0L  // the source wrote a last snapshot at stop: `refresh` reads it once more
  }

  def views: Seq[QueryView] = queries.values().asScala.toSeq.sortBy(v => -v.startedAt)

  def view(id: String): Option[QueryView] = Option(queries.get(id))

  /** The newest snapshot of `view` read so far. No I/O: pages and scrapes never wait for the store (a slow object
    * store would hold Jetty's threads); `refresh` reads, from the metrics updater's thread. */
  def snapshot(view: QueryView): Option[JsonNode] = view.snapshot

  /** Read `view`'s snapshot again if the last read is older than `RefreshMs` (a stopped query: once more). */
  def refresh(view: QueryView): Unit = {
    val now = System.currentTimeMillis()
    if (now - view.readAt >= RefreshMs && (view.active || view.readAt == 0L)) view.synchronized {
      if (now - view.readAt >= RefreshMs) {
        view.readAt = now
        try {
          RegionalShim.readStoreBytes(view.store, StatusFile) match {
            case None => view.readError = None  // no epoch recorded yet
            case Some(raw) =>
              val newline = raw.indexOf('\n'.toByte)
              val stamp = if (newline < 0) "" else new String(raw, 0, newline, StandardCharsets.US_ASCII)
              if (stamp != view.stamp || view.snapshot.isEmpty) {
                RegionalShim.readStoreFile(raw, "status", 1) match {
                  case Some(json) =>
                    view.snapshot = Some(mapper.readTree(json))
                    view.stamp = stamp
                    view.readError = None
                  case None => view.readError = Some(s"$StatusFile is torn or of another regional version")
                }
              }
          }
        } catch { case NonFatal(e) => view.readError = Some(e.toString) }
      }
    }
  }

  /** Seconds since `snapshot` was taken (its figures stop moving when the query stops or hangs). */
  def age(snapshot: JsonNode): Double =
    (System.currentTimeMillis() / 1000.0 - snapshot.path("taken_at").asDouble(0.0)).max(0.0)

  /** The snapshot's `metrics.<key>` (a dotted path), if it is a number. */
  def figure(node: JsonNode, path: String): Option[Double] = {
    val value = path.split('.').foldLeft(node.path("metrics"))((n, k) => n.path(k))
    if (value.isNumber) Some(value.asDouble()) else None
  }
}
