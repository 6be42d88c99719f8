package io.regional.shim

import java.util.concurrent.ConcurrentHashMap

import scala.jdk.CollectionConverters._

import org.apache.hadoop.fs.Path
import org.apache.spark.sql.{SparkSession, SparkSessionExtensions}
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan
import org.apache.spark.sql.catalyst.rules.Rule
import org.apache.spark.sql.catalyst.streaming.{StreamingRelationV2, WriteToStream}
import org.apache.spark.sql.connector.expressions.Transform
import org.apache.spark.sql.util.CaseInsensitiveStringMap

/** `spark.sql.extensions=io.regional.shim.RegionalExtensions`: what must happen when a query starts.
  * Both hooks see `WriteToStream`, where Spark has resolved the query's checkpoint location. */
class RegionalExtensions extends (SparkSessionExtensions => Unit) {
  override def apply(extensions: SparkSessionExtensions): Unit = {
    extensions.injectResolutionRule(session => new ShareCheckpointLocation(session))
    extensions.injectCheckRule(session => (plan: LogicalPlan) => {
      RegionalShim.install(session)  // a session without py4j (Spark Connect) gets the shim here
      StartCheck.check(session, plan)
    })
  }
}

/** One checkpoint location: the regional source reads its store from the sink's checkpointLocation. */
class ShareCheckpointLocation(session: SparkSession) extends Rule[LogicalPlan] {
  override def apply(plan: LogicalPlan): LogicalPlan = plan match {
    case w: WriteToStream if PlanCheck.hasRegionalSource(w.inputQuery) =>
      val root = w.resolvedCheckpointLocation
      val input = w.inputQuery.transformUp {
        case r: StreamingRelationV2 if PlanCheck.isRegionalSource(r) => withCheckpoint(r, root)
      }
      if (input eq w.inputQuery) w else w.copy(inputQuery = input)
    case other => other
  }

  private def withCheckpoint(r: StreamingRelationV2, root: String): StreamingRelationV2 =
    Option(r.extraOptions.get("checkpointLocation")) match {
      case Some(given) if qualified(given) == qualified(root) => r
      case Some(given) =>
        throw new IllegalArgumentException(
          s"regional: the regional source's checkpointLocation $given and the query's $root differ, so source " +
            "and sink would not share one store. Give checkpointLocation once, on writeStream")
      case None =>
        val options = new CaseInsensitiveStringMap(
          (r.extraOptions.asCaseSensitiveMap().asScala.toMap + ("checkpointLocation" -> root)).asJava)
        // The Python data source object was built with readStream's options when the DataFrame was
        // loaded, and Spark caches it in its provider: a fresh provider builds it again with these.
        r.source match {
          case Some(provider) =>
            val fresh = provider.getClass.getDeclaredConstructor().newInstance()
            fresh.getClass.getMethod("setShortName", classOf[String]).invoke(fresh, r.sourceName)
            val table = fresh.getTable(r.table.schema(), Array.empty[Transform], options.asCaseSensitiveMap())
            r.copy(source = Some(fresh), table = table, extraOptions = options)
          case None => r.copy(extraOptions = options)
        }
    }

  /** scheme, authority and path: `file:/x` and `file:///x` are one location. */
  private def qualified(location: String): (String, String, String) = {
    val path = new Path(location)
    val fs = path.getFileSystem(session.sparkContext.hadoopConfiguration)
    val uri = path.makeQualified(fs.getUri, fs.getWorkingDirectory).toUri
    (uri.getScheme, Option(uri.getAuthority).getOrElse(""), uri.getPath.stripSuffix("/"))
  }
}

/** Plan checks at query start, before any data moves. The outcome goes to `<store>/query-plan.json`,
  * which the Python source and sink read: a mixing plan runs with all-or-nothing epochs. */
object StartCheck {
  private val warned = ConcurrentHashMap.newKeySet[String]()

  def check(session: SparkSession, plan: LogicalPlan): Unit = plan match {
    case w: WriteToStream if PlanCheck.hasRegionalSource(w.inputQuery) && isRegionalSink(w) =>
      val threshold = session.conf.get("spark.sql.autoBroadcastJoinThreshold", "10485760")
      PlanCheck.classify(w.inputQuery, parseBytes(threshold)) match {
        case PlanCheck.Stateful(operator, why) =>
          throw new UnsupportedOperationException(
            s"regional: the query has a stateful operator ($operator) between the regional source and sink: $why")
        case PlanCheck.Mixing(operator, what) =>
          val reason = s"$what between the regional source and sink mixes regions in one task"
          record(w.resolvedCheckpointLocation, regional = false, Some(operator), Some(reason))
          if (warned.add(w.resolvedCheckpointLocation)) {
            RegionalShim.warn(s"regional: $reason; regional epochs are off for this query, epochs are all-or-nothing")
          }
        case PlanCheck.Narrow =>
          record(w.resolvedCheckpointLocation, regional = true, None, None)
      }
    case _ =>
  }

  // Some sinks' Table wrappers (a V1 sink such as Delta's) throw from name(): those are not regional.
  private def isRegionalSink(w: WriteToStream): Boolean =
    try w.sink.name().equalsIgnoreCase(PlanCheck.SourceName) catch { case _: IllegalStateException => false }

  private def record(root: String, regional: Boolean, operator: Option[String], reason: Option[String]): Unit =
    RegionalShim.storeDir(root).foreach { store =>
      RegionalShim.writeStoreFile(store, "query-plan.json", "query-plan", 1, RegionalShim.json(
        "shim" -> RegionalShim.Version, "regional_epochs" -> regional,
        "operator" -> operator, "reason" -> reason, "checked_at_ms" -> System.currentTimeMillis()))
    }

  private def parseBytes(value: String): Long =
    try org.apache.spark.network.util.JavaUtils.byteStringAsBytes(value)
    catch { case _: Exception => -1L }
}
