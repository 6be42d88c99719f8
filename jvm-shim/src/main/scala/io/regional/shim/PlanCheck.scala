package io.regional.shim

import org.apache.spark.sql.catalyst.plans.{Cross, ExistenceJoin, Inner, JoinType, LeftAnti, LeftOuter, LeftSemi, RightOuter}
import org.apache.spark.sql.catalyst.plans.logical.{BROADCAST, Join, LogicalPlan, RebalancePartitions, Repartition, RepartitionByExpression, ResolvedHint, Sort, Union}
import org.apache.spark.sql.catalyst.streaming.StreamingRelationV2

/** What lies between the regional source and the regional sink, from the query's analyzed plan. */
sealed trait PlanCheck
object PlanCheck {
  /** Only narrow operators: partition i of the sink is region i of the source. */
  case object Narrow extends PlanCheck
  /** Rows of different regions meet in one task: regional epochs are off, epochs are all-or-nothing. */
  final case class Mixing(operator: String, what: String) extends PlanCheck
  /** State across epochs and regions: refused. */
  final case class Stateful(operator: String, why: String) extends PlanCheck

  val SourceName = "regional"

  // By class name, so that a node missing from another Spark version does not break linking.
  private val StatefulOperators: Map[String, String] = Map(
    "Aggregate" -> "an aggregation",
    "Deduplicate" -> "dropDuplicates",
    "DeduplicateWithinWatermark" -> "dropDuplicatesWithinWatermark",
    "Distinct" -> "distinct",
    "FlatMapGroupsWithState" -> "flatMapGroupsWithState / mapGroupsWithState",
    "FlatMapGroupsInPandasWithState" -> "applyInPandasWithState",
    "TransformWithState" -> "transformWithState",
    "TransformWithStateInPySpark" -> "transformWithStateInPandas",
    "GlobalLimit" -> "a limit on a stream",
    "Window" -> "a window function",
  )
  private val StatefulWhy =
    "it keeps state across epochs and regions, and regional epochs commit regions at different epochs, so that " +
      "state would count a fallen-back region's rows in the wrong epoch or twice. Move the stateful step after " +
      "the regional sink (read the target as a stream), or use a non-regional source"

  def isRegionalSource(plan: LogicalPlan): Boolean = plan match {
    case r: StreamingRelationV2 => r.sourceName.equalsIgnoreCase(SourceName)
    case _ => false
  }

  def hasRegionalSource(plan: LogicalPlan): Boolean = plan.find(isRegionalSource).isDefined

  /** Classifies the operators on the path from the sink (the top of `query`) down to the regional source.
    * `broadcastThreshold` is spark.sql.autoBroadcastJoinThreshold. */
  def classify(query: LogicalPlan, broadcastThreshold: Long): PlanCheck = {
    val path = query.collect { case node if hasRegionalSource(node) => node }
    val stateful = path.collectFirst {
      case j: Join if j.left.isStreaming && j.right.isStreaming =>
        Stateful("Join", s"a stream-stream join: $StatefulWhy")
      case node if StatefulOperators.contains(node.nodeName) =>
        Stateful(node.nodeName, s"${StatefulOperators(node.nodeName)}: $StatefulWhy")
    }
    stateful.orElse(path.collectFirst(Function.unlift(mixing(_, broadcastThreshold)))).getOrElse(Narrow)
  }

  private def mixing(node: LogicalPlan, broadcastThreshold: Long): Option[Mixing] = node match {
    case r: Repartition if r.shuffle => Some(Mixing("Repartition", s"repartition(${r.numPartitions})"))
    case r: Repartition => Some(Mixing("Repartition", s"coalesce(${r.numPartitions})"))
    case _: RepartitionByExpression => Some(Mixing("RepartitionByExpression", "repartition by columns"))
    case _: RebalancePartitions => Some(Mixing("RebalancePartitions", "a rebalance hint"))
    case s: Sort if s.global => Some(Mixing("Sort", "a global sort (orderBy)"))
    case u: Union if u.children.size > 1 => Some(Mixing("Union", "a union"))
    case j: Join if !broadcastsStaticSide(j, broadcastThreshold) =>
      Some(Mixing("Join", "a join whose static side is not broadcast (it shuffles the stream)"))
    case _ => None
  }

  /** A stream-static join keeps the stream's partitioning when the static side is broadcast:
    * a broadcast hint, or a size under the threshold, on a side the join type lets Spark build. */
  private def broadcastsStaticSide(j: Join, threshold: Long): Boolean = {
    val staticIsRight = !j.right.isStreaming
    val static = if (staticIsRight) j.right else j.left
    val buildable = if (staticIsRight) canBuildRight(j.joinType) else canBuildLeft(j.joinType)
    val hinted = static.find {
      case h: ResolvedHint => h.hints.strategy.contains(BROADCAST)
      case _ => false
    }.isDefined
    val small = threshold > 0 && (try static.stats.sizeInBytes <= BigInt(threshold) catch { case _: Exception => false })
    buildable && (hinted || small)
  }

  private def canBuildRight(t: JoinType): Boolean = t match {
    case Inner | Cross | LeftOuter | LeftSemi | LeftAnti | _: ExistenceJoin => true
    case _ => false
  }

  private def canBuildLeft(t: JoinType): Boolean = t match {
    case Inner | Cross | RightOuter => true
    case _ => false
  }
}
