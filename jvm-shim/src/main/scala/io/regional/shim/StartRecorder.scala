package io.regional.shim

import scala.io.Source
import scala.util.control.NonFatal

import org.apache.spark.sql.SparkSession
import org.apache.spark.sql.streaming.StreamingQueryListener
import org.apache.spark.sql.streaming.StreamingQueryListener.{QueryProgressEvent, QueryStartedEvent, QueryTerminatedEvent}

/** Records writeStream's regional settings in the store when a regional query starts, on the driver, so that
  * the source's first plan resolves one set of settings from both sides. Spark delivers `onQueryStarted`
  * synchronously inside `start()`, before the source plans epoch 0. This runs where the query runs: with
  * Spark Connect the client has no JVM and its listeners run in the client, after the fact; the shim's
  * recorder is the one that works both ways (the Python listener records only when the shim is not loaded).
  *
  * Only the keys of `regional.protocol.settings.DEFAULTS` are recorded (the build writes them into the jar as
  * `setting-keys.txt`): a target's credentials among writeStream's options never reach the store. */
class StartRecorder(sessionRef: java.lang.ref.WeakReference[SparkSession]) extends StreamingQueryListener {
  // Weak: Spark keeps a session's streaming listener bus on the SparkContext, and so this listener; a strong
  // reference would keep every session (Spark Connect's come and go) for the SparkContext's life.
  override def onQueryStarted(event: QueryStartedEvent): Unit =
    try record(event)
    catch {
      // Never fail Spark's listener bus: without the record, the source refuses to plan with a clear error.
      case NonFatal(e) => RegionalShim.warn(s"regional: could not record writeStream's settings of query ${event.id}: $e")
    }

  override def onQueryProgress(event: QueryProgressEvent): Unit = ()
  override def onQueryTerminated(event: QueryTerminatedEvent): Unit =
    try org.apache.spark.regional.RegionalBoard.terminated(event.id.toString, event.runId.toString, event.exception)
    catch { case NonFatal(e) => RegionalShim.warn(s"regional: the Regional tab missed the end of query ${event.id}: $e") }

  private def record(event: QueryStartedEvent): Unit = {
    val session = sessionRef.get()
    if (session == null) return
    val wrapper = session.streams.get(event.id)
    if (wrapper == null) return
    val execution = wrapper.getClass.getMethod("streamingQuery").invoke(wrapper)  // internal (Spark 4.2)
    val sink = execution.getClass.getMethod("sink").invoke(execution)
    val name = try sink.getClass.getMethod("name").invoke(sink).toString catch { case NonFatal(_) => "" }
    if (!name.equalsIgnoreCase(PlanCheck.SourceName)) return
    val root = execution.getClass.getMethod("resolvedCheckpointRoot").invoke(execution).asInstanceOf[String]
    RegionalShim.storeDir(root).foreach { store =>
      try org.apache.spark.regional.RegionalBoard.started(event.id.toString, event.runId.toString,
        Option(event.name), store)
      catch { case NonFatal(e) => RegionalShim.warn(s"regional: the Regional tab cannot show query ${event.id}: $e") }
      // A previous run's record goes first: if this run's cannot be made, the source finds none and refuses
      // to plan, rather than plan with settings writeStream may no longer give.
      RegionalShim.deleteStoreFile(store, StartRecorder.FileName)
      val keys = StartRecorder.settingKeys
      val given = StartRecorder.writeOptions(execution).flatMap { case (k, v) =>
        keys.get(k.toLowerCase(java.util.Locale.ROOT)).map(_ -> v)
      }
      RegionalShim.writeStoreFile(store, StartRecorder.FileName, "write-options", 1, RegionalShim.json(
        "run_id" -> event.runId.toString, "options" -> given,
        "recorded_at" -> System.currentTimeMillis() / 1000.0, "recorded_by" -> "jvm-shim"))
    }
  }
}

object StartRecorder {
  val FileName = "write-options.json"

  /** lower-cased -> canonical spelling of regional's setting keys, from the jar's `setting-keys.txt`. */
  lazy val settingKeys: Map[String, String] = {
    val in = getClass.getResourceAsStream("setting-keys.txt")
    if (in == null) throw new IllegalStateException(
      "regional's shim jar lacks setting-keys.txt: rebuild it with `python -m regional build-shim`")
    val source = Source.fromInputStream(in, "UTF-8")
    try source.getLines().map(_.trim).filter(_.nonEmpty).map(k => k.toLowerCase(java.util.Locale.ROOT) -> k).toMap
    finally source.close()
  }

  /** writeStream's options of a running query: `MicroBatchExecution.extraOptions` (private; Spark 4.2). */
  def writeOptions(execution: AnyRef): Map[String, String] = {
    var cls: Class[_] = execution.getClass
    while (cls != null) {
      try {
        val field = cls.getDeclaredField("extraOptions")
        field.setAccessible(true)
        return field.get(execution).asInstanceOf[scala.collection.Map[String, String]].toMap
      } catch { case _: NoSuchFieldException => cls = cls.getSuperclass }
    }
    throw new IllegalStateException("this Spark's streaming query has no extraOptions field: regional supports Spark 4.2")
  }
}
