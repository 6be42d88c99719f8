package org.apache.spark.regional

import java.util.concurrent.{ConcurrentHashMap, Executors, TimeUnit}

import scala.jdk.CollectionConverters._
import scala.util.control.NonFatal

import com.codahale.metrics.{Gauge, MetricRegistry}
import com.fasterxml.jackson.databind.JsonNode

import org.apache.spark.SparkEnv
import org.apache.spark.metrics.source.Source

import io.regional.shim.RegionalShim

/** regional's figures in Spark's metrics system, so that every sink a user configured gets them (the
  * PrometheusServlet, JMX, Graphite, CSV...): one source per query, `regional.<query name or id>`, as Spark's own
  * streaming metrics are one source per query. Gauges read the query's newest status snapshot. Per region, for
  * the `spark.regional.metrics.regions` regions (default 100) with the largest lag: `region.<id>.<figure>`. */
object RegionalMetrics {
  val RegionsConf = "spark.regional.metrics.regions"
  val DefaultRegions = 100
  /** Snapshots are read, and the per-region gauges follow the regions with the largest lag, this often. */
  val RefreshMs: Long = RegionalBoard.RefreshMs

  /** metric name -> (the snapshot's `metrics` key, help text). Prometheus' conventions: snake case, the unit
    * as a suffix, `_total` for what only grows. */
  val QueryFigures: Seq[(String, String, String)] = Seq(
    ("regions", "regions", "regions the query knows"),
    ("regions_with_work", "regions_with_work", "regions with work in the newest epoch"),
    ("regions_fallen_back", "fallen_back", "regions behind now (fallen back, quarantined ones not counted)"),
    ("regions_quarantined", "quarantined", "regions quarantined now"),
    ("regions_isolating", "isolating", "regions isolating a poison record now"),
    ("oldest_ref_epoch_age_epochs", "oldest_ref_age_epochs", "epochs since the oldest ref_epoch a region references"),
    ("oldest_ref_epoch_age_seconds", "oldest_ref_age_seconds", "seconds since the oldest ref_epoch was recorded"),
    ("epoch", "epoch", "the newest recorded epoch"),
    ("epochs_total", "epochs_total", "epochs recorded"),
    ("regional_epochs_total", "regional_epochs", "regional epochs recorded (FLIP-600's first metric)"),
    ("recent_epochs_global", "recent_epochs.global", "global epochs among the newest 20"),
    ("recent_epochs_regional", "recent_epochs.regional", "regional epochs among the newest 20"),
    ("recent_epochs_forced_global", "recent_epochs.forced_global", "forced global epochs among the newest 20"),
    ("recent_epochs_aborted", "recent_epochs.aborted", "aborted epochs among the newest 20"),
    ("dead_letters_total", "dead_letters", "records dead-lettered"),
    ("lag", "lag", "offsets seen by the source and not committed, all regions"),
    ("lag_max", "max_lag", "the largest lag of a region"),
    ("outage_epochs", "outage_epochs", "epochs in a row in which every region with work failed"),
    ("backoff_seconds", "backoff_seconds", "how long the next epoch waits (an outage's back-off)"))

  /** region metric name -> (the region row's key, help text). */
  val RegionFigures: Seq[(String, String, String)] = Seq(
    ("lag", "lag", "offsets seen by the source and not committed"),
    ("consecutive_failures", "consecutive_failures", "epochs in a row the region failed"),
    ("ref_epoch_age_epochs", "ref_age_epochs", "epochs since the region's ref_epoch (0: current)"),
    ("ref_epoch_age_seconds", "ref_age_seconds", "seconds since the region's ref_epoch was recorded (0: current)"))

  private val sources = new ConcurrentHashMap[String, QuerySource]()  // by query id
  @volatile private var updater: Option[java.util.concurrent.ScheduledExecutorService] = None

  def register(view: QueryView): Unit = try {
    val env = SparkEnv.get
    if (env == null) return
    val source = new QuerySource(view, regionsLimit(env))
    sources.put(view.id, source)
    env.metricsSystem.registerSource(source)
    startUpdater()
  } catch { case NonFatal(e) => RegionalShim.warn(s"regional: could not register the metrics of query ${view.id}: $e") }

  def remove(view: QueryView): Unit = Option(sources.remove(view.id)).foreach { source =>
    Option(SparkEnv.get).foreach(_.metricsSystem.removeSource(source))
  }

  def regionsLimit(env: SparkEnv): Int = env.conf.getInt(RegionsConf, DefaultRegions).max(0)

  private def startUpdater(): Unit = synchronized {
    if (updater.isEmpty) {
      val executor = Executors.newSingleThreadScheduledExecutor { (r: Runnable) =>
        val t = new Thread(r, "regional-metrics"); t.setDaemon(true); t
      }
      // The one thread that reads snapshots: pages and scrapes use what it read last, and never wait for a store.
      executor.scheduleWithFixedDelay(() => RegionalBoard.views.foreach { view =>
        try {
          RegionalBoard.refresh(view)
          Option(sources.get(view.id)).foreach(_.updateRegions())
        } catch { case NonFatal(_) => () }
      }, 0, RefreshMs, TimeUnit.MILLISECONDS)
      updater = Some(executor)
    }
  }

  /** A metric name part from the outside world (a query name, a region id): Dropwizard separates with dots and
    * most sinks allow little else, so anything but letters, digits and `_` becomes `_`, and a short hash
    * keeps two ids apart that would read the same. */
  def namePart(raw: String): String = {  // only [A-Za-z0-9_]: Spark's PrometheusServlet turns the rest into `_`
    val clean = raw.map(c => if (c.isLetterOrDigit && c < 128 || c == '_') c else '_')
    if (clean == raw && raw.nonEmpty) raw else s"${clean.take(60)}_${(raw.hashCode & 0xffffff).toHexString}"
  }

  /** A region row's figure: a null age means the region is current (0); a null lag means the source has not
    * said where the region ends (NaN: unknown, never 0). */
  def regionValue(row: JsonNode, key: String): Double = {
    val value = row.path(key)
    if (value.isNumber) value.asDouble() else if (value.isNull && key.startsWith("ref_age")) 0.0 else Double.NaN
  }

  /** The regions with the largest lag (ties: by id), at most `limit`. */
  def topRegions(node: JsonNode, limit: Int): Seq[(String, JsonNode)] =
    node.path("regions").properties().asScala.toSeq.map(e => e.getKey -> e.getValue)
      .sortBy { case (id, row) => (-row.path("lag").asLong(0L), id) }.take(limit)
}

final class QuerySource(view: QueryView, regionsLimit: Int) extends Source {
  import RegionalMetrics._

  // The query id's first 8 characters keep two queries of one name apart (a stopped one stays listed), and
  // stop one name being a prefix of another's (Spark's removeSource removes every metric under the prefix).
  override val sourceName: String = s"regional.${namePart(view.label)}_${view.id.take(8)}"
  override val metricRegistry: MetricRegistry = new MetricRegistry
  private val regionGauges = new ConcurrentHashMap[String, String]()  // metric name prefix -> region id

  private def gauge(name: String)(value: => Double): Unit =
    metricRegistry.register(name, new Gauge[Double] { override def getValue: Double = value })

  QueryFigures.foreach { case (name, key, _) =>
    gauge(name)(RegionalBoard.snapshot(view).flatMap(RegionalBoard.figure(_, key)).getOrElse(Double.NaN))
  }
  gauge("active")(if (view.active) 1.0 else 0.0)
  gauge("status_age_seconds")(RegionalBoard.snapshot(view).map(RegionalBoard.age).getOrElse(Double.NaN))

  /** Gauges for the regions with the largest lag now; those that left the top set are removed. */
  def updateRegions(): Unit = {
    val top = RegionalBoard.snapshot(view).map(topRegions(_, regionsLimit)).getOrElse(Seq.empty)
    val wanted = top.map { case (id, _) => s"region.${namePart(id)}" -> id }.toMap
    regionGauges.keys().asScala.toSeq.filterNot(wanted.contains).foreach { prefix =>
      RegionFigures.foreach { case (name, _, _) => metricRegistry.remove(s"$prefix.$name") }
      regionGauges.remove(prefix)
    }
    wanted.foreach { case (prefix, id) =>
      if (regionGauges.putIfAbsent(prefix, id) == null) RegionFigures.foreach { case (name, key, _) =>
        gauge(s"$prefix.$name")(regionFigure(id, key))
      }
    }
  }

  def regionFigure(id: String, key: String): Double =
    RegionalBoard.snapshot(view).map(s => regionValue(s.path("regions").path(id), key)).getOrElse(Double.NaN)
}
