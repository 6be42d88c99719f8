package io.regional.shim

import java.util.concurrent.ConcurrentHashMap

import scala.util.control.NonFatal

import org.apache.spark.{ExceptionFailure, Success, TaskFailedReason}
import org.apache.spark.scheduler.{SparkListener, SparkListenerStageCompleted, SparkListenerStageSubmitted, SparkListenerTaskEnd}

/** Records why task attempts of regional queries failed, into the query's regional store as
  * `failures/<epoch>/<partition>-<attempt>.json`; the Python driver maps partition i to the
  * plan's region i and puts the cause in the epoch record of a region that fell back. */
class FailureListener extends SparkListener {
  private val QueryIdKey = "sql.streaming.queryId"
  private val BatchIdKey = "streaming.sql.batchId"
  private val stages = new ConcurrentHashMap[Int, (String, Long)]()

  override def onStageSubmitted(event: SparkListenerStageSubmitted): Unit = {
    val props = event.properties
    if (props != null) {
      val query = props.getProperty(QueryIdKey)
      val batch = props.getProperty(BatchIdKey)
      if (query != null && batch != null) {
        try stages.put(event.stageInfo.stageId, (query, batch.toLong))
        catch { case _: NumberFormatException => }
      }
    }
  }

  override def onStageCompleted(event: SparkListenerStageCompleted): Unit =
    stages.remove(event.stageInfo.stageId)

  override def onTaskEnd(event: SparkListenerTaskEnd): Unit = event.reason match {
    case Success =>
    case reason: TaskFailedReason =>
      val stage = stages.get(event.stageId)
      if (stage != null) {
        try record(stage._1, stage._2, event, reason)
        catch { case NonFatal(e) => RegionalShim.warn(s"regional: could not record a task failure: $e") }
      }
    case _ =>
  }

  private def record(queryId: String, batchId: Long, event: SparkListenerTaskEnd, reason: TaskFailedReason): Unit = {
    for {
      root <- RegionalShim.checkpointRoot(queryId)
      store <- RegionalShim.storeDir(root)
      if RegionalShim.storeExists(store)
    } {
      val info = event.taskInfo
      val (exceptionClass, message) = reason match {
        case e: ExceptionFailure => (e.className, FailureListener.firstLine(e.className, e.description))
        case other => (other.getClass.getSimpleName, FailureListener.firstLine("", other.toErrorString))
      }
      // The whole description too, for the driver to read a Python exception's class only where the traceback
      // leaves no doubt (a message of several lines can hold another class's line); null past the cap.
      val description = reason match {
        case e: ExceptionFailure if e.description != null && e.description.length <= FailureListener.DescriptionCap =>
          e.description
        case _ => null
      }
      val content = RegionalShim.json(
        "query_id" -> queryId, "epoch" -> batchId, "partition" -> info.partitionId,
        "attempt" -> info.attemptNumber, "executor" -> info.executorId,
        "exception_class" -> exceptionClass, "message" -> message, "description" -> description)
      RegionalShim.writeStoreFile(store, s"failures/$batchId/${info.partitionId}-${info.attemptNumber}.json",
        "failure", 1, content)
    }
  }
}

object FailureListener {
  val DescriptionCap = 16000

  /** The line that says what went wrong. For a Python worker's exception (a UDF, the source), that is
    * the exception line at the end of the Python traceback, not the JVM wrapper's first line. */
  def firstLine(className: String, description: String): String = {
    val lines = Option(description).getOrElse("").split("\n").map(_.stripTrailing).filter(_.trim.nonEmpty)
    val traceback = lines.lastIndexWhere(_.contains("Traceback (most recent call last)"))
    val line =
      if (traceback >= 0) lines.drop(traceback + 1).filterNot(l => l.startsWith(" ") || l.startsWith("\t")).lastOption
      else lines.headOption
    line.map(_.trim).getOrElse(className).take(500)
  }
}
